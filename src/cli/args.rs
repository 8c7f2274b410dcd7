//! The command line's shape: every command, flag and help text, as clap
//! derive types. Definitions only; nothing here runs a command.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "distributor",
    version,
    about = "Verify bundles against their manifests and publish them into catalogued destination roots",
    after_help = "Example (from a checkout):\n  distributor --config spool-example/config.yaml run --pipeline reports --dry-run spool-example/bundles/weekly-2026-06-08"
)]
pub struct Cli {
    /// Config file (default: $DISTRIBUTOR_CONFIG, else /etc/distributor/config.yaml)
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the spool agent (foreground; SIGTERM/SIGINT stop, SIGHUP reloads)
    #[command(
        after_help = "Example:\n  distributor --config /etc/distributor/config.yaml agent\n  distributor --config spool-example/config.yaml agent --once"
    )]
    Agent {
        /// Process work/ and every inbox once, then exit (0: all done, 1: some failed)
        #[arg(long)]
        once: bool,
    },
    /// Plan and publish one bundle folder in place (the folder is not moved)
    #[command(
        after_help = "Example:\n  distributor run --pipeline reports --dry-run ./bundles/report-1\n  distributor run --pipeline reports --destination site --force ./bundles/report-1"
    )]
    Run(RunArgs),
    /// Retention pruning of one owner's outputs
    #[command(
        after_help = "Example:\n  distributor prune --pipeline reports --destination archive --dry-run\n  distributor prune --pipeline reports --destination archive --apply"
    )]
    #[command(group(clap::ArgGroup::new("mode").required(true).args(["dry_run", "apply"])))]
    Prune {
        #[command(flatten)]
        target: TargetArgs,
        /// Report what would be deleted, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Delete the selected outputs
        #[arg(long)]
        apply: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Drop catalog records whose file is gone; report unmanaged entries
    #[command(
        name = "reconcile-state",
        after_help = "Example:\n  distributor reconcile-state --pipeline reports --destination archive --dry-run"
    )]
    ReconcileState {
        #[command(flatten)]
        target: TargetArgs,
        /// Every record of the root, not only this owner's
        #[arg(long)]
        all_owners: bool,
        /// Report, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Re-hash managed outputs; report missing and mismatched files, and objects stored with other headers (exit 1 if any)
    #[command(
        after_help = "Example:\n  distributor verify --pipeline reports --destination archive --all-owners"
    )]
    Verify {
        #[command(flatten)]
        target: TargetArgs,
        /// Every record of the root, not only this owner's
        #[arg(long)]
        all_owners: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// List the catalog records of a destination root
    #[command(
        after_help = "Example:\n  distributor catalog --pipeline reports --destination archive --json"
    )]
    Catalog {
        #[command(flatten)]
        target: TargetArgs,
        /// Print the records as JSON
        #[arg(long)]
        json: bool,
    },
    /// Switch a release destination back to an earlier release (exit 3: none)
    #[command(
        after_help = "Example:\n  distributor rollback --pipeline site --destination www --dry-run\n  distributor rollback --pipeline site --destination www --to 20261207T031500Z"
    )]
    Rollback {
        #[command(flatten)]
        target: TargetArgs,
        /// The release to switch to (default: the one before the current)
        #[arg(long, value_name = "RELEASE")]
        to: Option<String>,
        /// Say what would be switched, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// List a release destination's releases, newest first, the current marked
    #[command(
        after_help = "Example:\n  distributor releases --pipeline site --destination www --json"
    )]
    Releases {
        #[command(flatten)]
        target: TargetArgs,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
    },
    /// Inspect spools; move a failed bundle back to the inbox
    #[command(
        subcommand,
        after_help = "Example:\n  distributor spool list --failed\n  distributor spool show reports weekly-2026-06-08\n  distributor spool retry reports weekly-2026-06-08"
    )]
    Spool(SpoolCommand),
    /// One screen per pipeline: serving agent, last success and failure, spool counts, catalogs
    #[command(
        after_help = "Example:\n  distributor --config /etc/distributor/config.yaml status\n  distributor status --check   # exit 1 and one line per problem: unserved pipeline, failed or stuck bundle"
    )]
    Status {
        /// Print the summary as JSON
        #[arg(long)]
        json: bool,
        /// Exit 1 when a pipeline has no agent, a bundle is failed, or an inbox entry is older than agent.incomplete_timeout
        #[arg(long)]
        check: bool,
    },
    /// Producer helpers: seal, verify and upload bundles (no config needed)
    #[command(
        subcommand,
        after_help = "Example:\n  distributor bundle seal /srv/inbox/reports/.staging-2026-06-04 --id reports.2026-06-04\n  distributor bundle verify /srv/inbox/reports/.staging-2026-06-04\n  mv /srv/inbox/reports/.staging-2026-06-04 /srv/inbox/reports/2026-06-04\n  distributor bundle upload ./2026-06-04 s3://intake/reports/inbox/2026-06-04"
    )]
    Bundle(BundleCommand),
    /// Configuration helpers
    #[command(
        subcommand,
        after_help = "Example:\n  distributor --config /etc/distributor/config.yaml config check\n  runuser -u distributor -- distributor config check --strict"
    )]
    Config(ConfigCommand),
    /// Renders one markdown file from stdin to stdout under a memory limit:
    /// the agent's own child process (see `render::child`), not for people.
    #[command(name = "__render", hide = true)]
    Render,
    /// Writes the manual pages and shell completions into DIR (see
    /// `cli::docs`): the Debian package's build runs it, not for people.
    #[command(name = "__generate-docs", hide = true)]
    GenerateDocs { dir: PathBuf },
    /// Prints the ids of the configured pipelines, one a line: what the
    /// shell completions offer after --pipeline; not for people.
    #[command(name = "__pipelines", hide = true)]
    Pipelines,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline whose destinations receive the bundle
    #[arg(long, value_name = "P")]
    pub pipeline: String,
    /// Only these destinations (repeatable; default: all of the pipeline)
    #[arg(long = "destination", value_name = "D")]
    pub destinations: Vec<String>,
    /// Plan and report, change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Replace everything in the named destinations' roots (needs --destination)
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// List every file written, deleted or blocking (text output; default: a summary)
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// The bundle folder (holding manifest.json)
    pub bundle_dir: PathBuf,
}

/// Selects one destination root.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Pipeline id
    #[arg(long, value_name = "P")]
    pub pipeline: String,
    /// Destination id
    #[arg(long, value_name = "D")]
    pub destination: String,
}

#[derive(Debug, Subcommand)]
pub enum SpoolCommand {
    /// List bundles in the spools (oldest first)
    #[command(
        after_help = "Example:\n  distributor spool list --failed\n  distributor spool list --pipeline reports --json"
    )]
    List {
        /// Only this pipeline
        #[arg(long, value_name = "P")]
        pipeline: Option<String>,
        /// Only failed/
        #[arg(long, conflicts_with_all = ["done", "inbox"])]
        failed: bool,
        /// Only done/
        #[arg(long, conflicts_with = "inbox")]
        done: bool,
        /// Only inbox/
        #[arg(long)]
        inbox: bool,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
    },
    /// Move failed/NAME (or every failed bundle) back into the inbox (clears its result and attempt count)
    #[command(
        after_help = "Example:\n  distributor spool retry reports weekly-2026-06-08\n  distributor spool retry reports --all\n  distributor spool retry --all"
    )]
    Retry {
        /// Pipeline id (with --all and no pipeline: every pipeline)
        #[arg(required_unless_present = "all")]
        pipeline: Option<String>,
        /// Bundle name as shown by `spool list --failed`
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        name: Option<String>,
        /// Every failed bundle of the pipeline (of every pipeline when none is named)
        #[arg(long)]
        all: bool,
        /// Retry even a bundle that would overwrite or delete outputs of a
        /// source created after its own (roll the destination back)
        #[arg(long)]
        allow_older: bool,
    },
    /// Make the running agent try its deferred bundles now (of P, or of every pipeline)
    #[command(
        after_help = "Example:\n  distributor spool flush reports\n  distributor spool flush"
    )]
    Flush {
        /// Pipeline id (default: every pipeline)
        pipeline: Option<String>,
    },
    /// Stop claiming P's bundles (they wait in the inbox; a bundle in hand finishes), across restarts
    #[command(after_help = "Example:\n  distributor spool hold reports")]
    Hold {
        /// Pipeline id
        pipeline: String,
    },
    /// Lift `spool hold`: the agent claims P's bundles again
    #[command(after_help = "Example:\n  distributor spool release reports")]
    Release {
        /// Pipeline id
        pipeline: String,
    },
    /// Print a failed or done bundle's result (stage, error, what each destination did)
    #[command(after_help = "Example:\n  distributor spool show reports weekly-2026-06-08")]
    Show {
        /// Pipeline id
        pipeline: String,
        /// Bundle name as shown by `spool list --failed` or `--done`
        name: String,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Delete failed/NAME with everything in it (asks nothing; prints what it removed)
    #[command(after_help = "Example:\n  distributor spool delete reports weekly-2026-06-08")]
    Delete {
        /// Pipeline id
        pipeline: String,
        /// Bundle name as shown by `spool list --failed`
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Hash every regular file under DIR and write DIR/manifest.json atomically
    #[command(
        after_help = "Examples:\n  distributor bundle seal ./.staging-report --id reports.2026-06-04\n  distributor bundle seal ./.staging-report --id reports.2026-06-04 --sign ~/.ssh/deploy_ed25519"
    )]
    Seal {
        dir: PathBuf,
        /// Source id (letters, digits, '.', '_', '-'; up to 128)
        #[arg(long)]
        id: String,
        /// RFC 3339 creation time (default: now)
        #[arg(long, value_name = "RFC3339")]
        created: Option<String>,
        /// Also sign the manifest with this OpenSSH key (writes manifest.json.sig; an encrypted or agent-held key is signed by ssh-keygen)
        #[arg(long, value_name = "KEY")]
        sign: Option<PathBuf>,
        /// The namespace to sign in: the pipeline's signatures.namespace
        #[arg(long, value_name = "NAMESPACE", default_value = crate::signature::NAMESPACE, requires = "sign")]
        namespace: String,
    },
    /// Check a bundle against its manifest and print every problem
    #[command(
        after_help = "Examples:\n  distributor bundle verify ./inbox/report-1\n  distributor bundle verify ./inbox/report-1 --signers /etc/distributor/docs.signers"
    )]
    Verify {
        dir: PathBuf,
        /// Also check manifest.json.sig against this allowed_signers file, as the agent would
        #[arg(long, value_name = "FILE")]
        signers: Option<PathBuf>,
        /// The namespace the signature must be in: the pipeline's signatures.namespace
        #[arg(long, value_name = "NAMESPACE", default_value = crate::signature::NAMESPACE, requires = "signers")]
        namespace: String,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Check a bundle as the agent would, then upload it into an intake's inbox in a bucket, manifest.json last
    #[command(
        after_help = "Credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN).\nOnly the files manifest.json lists are uploaded, then manifest.json.sig, then manifest.json.\n\nExamples:\n  distributor bundle upload ./build/2026-06-04 s3://intake/reports/inbox/2026-06-04\n  distributor bundle upload ./report-1 s3://intake/reports/inbox/report-1 --endpoint http://127.0.0.1:8333 --json"
    )]
    Upload {
        /// The bundle folder (holding manifest.json)
        dir: PathBuf,
        /// Where the bundle goes: s3://BUCKET/PATH/inbox/NAME, with PATH the intake's path and NAME the bundle's name
        #[arg(value_name = "URL")]
        url: String,
        /// An S3-compatible server, such as http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS)
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// The bucket's region (default: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1)
        #[arg(long)]
        region: Option<String>,
        /// Also check manifest.json.sig against this allowed_signers file before uploading, as the agent would
        #[arg(long, value_name = "FILE")]
        signers: Option<PathBuf>,
        /// The namespace the signature must be in: the pipeline's signatures.namespace
        #[arg(long, value_name = "NAMESPACE", default_value = crate::signature::NAMESPACE, requires = "signers")]
        namespace: String,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config, print a summary, and warn about folders the running user cannot write
    #[command(
        after_help = "Example:\n  runuser -u distributor -- distributor --config /etc/distributor/config.yaml config check --strict"
    )]
    Check {
        /// Print the summary as JSON
        #[arg(long)]
        json: bool,
        /// Fail on two kinds of warning: exit 2 when a spool folder or destination root is not writable by the running user, 1 when destinations of different pipelines share a root with overlapping scopes
        #[arg(long)]
        strict: bool,
    },
}
