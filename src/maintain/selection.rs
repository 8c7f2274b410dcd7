//! Which records a retention policy prunes: a pure function of the catalog,
//! the policy and the time (docs/contract.md §11.7), shared by local and s3
//! roots.

use crate::catalog::OutputRecord;
use crate::config::PrunePolicy;
use std::collections::BTreeSet;
use time::OffsetDateTime;

/// The paths of the owner's records that `policy` prunes at `now`, sorted.
///
/// A record is prunable when its `updated_at` is strictly older than
/// `now - max_age` and its source is not among the owner's `keep_latest`
/// newest distinct sources (`id`, `digest`, `created`), newest by
/// `source.created` as an instant. Sources tied with the last kept one are
/// kept too: pruning never deletes a source as new as one it keeps.
/// Records of other owners are never selected.
pub fn select_prunable(
    records: &[OutputRecord],
    pipeline_id: &str,
    destination_id: &str,
    policy: &PrunePolicy,
    now: OffsetDateTime,
) -> Vec<String> {
    let owned: Vec<&OutputRecord> = records
        .iter()
        .filter(|r| r.owned_by(pipeline_id, destination_id))
        .collect();
    // A max_age too large to subtract means nothing is old enough.
    let Some(cutoff) = time::Duration::try_from(policy.max_age)
        .ok()
        .and_then(|age| now.checked_sub(age))
    else {
        return Vec::new();
    };

    let mut created: Vec<OffsetDateTime> = owned
        .iter()
        .map(|r| (&r.source.id, &r.source.digest, r.source.created))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|(_, _, c)| c)
        .collect();
    created.sort_by(|a, b| b.cmp(a));
    let keep_from = match usize::try_from(policy.keep_latest) {
        Ok(0) => None,
        Ok(n) => Some(created.get(n - 1).or(created.last()).copied()),
        Err(_) => Some(created.last().copied()),
    }
    .flatten();

    let mut out: Vec<String> = owned
        .into_iter()
        .filter(|r| r.updated_at < cutoff)
        .filter(|r| keep_from.is_none_or(|newest_kept| r.source.created < newest_kept))
        .map(|r| r.path.as_str().to_owned())
        .collect();
    out.sort();
    out
}
