//! What went wrong with a request to the bucket, said without anything the
//! server sent: an error answer's body and headers are hostile (an S3 server
//! answering `SignatureDoesNotMatch` echoes the signed request, session
//! token and access key id included), so they never reach a message, a log
//! line, a result file or `status` (docs/object-storage.md, "When the
//! server fails").
//!
//! Owns three things: [`Failure`], the description and classification of a
//! failed request, derived only from the structure of an
//! `object_store::Error` (its variant, the transport error kind in its
//! source chain, the HTTP status); [`GuardedConnector`], the HTTP client
//! every s3 root uses, which drops the body of every error answer and
//! remembers its status for [`answered`]; and the time limits of a request.
//! It never formats an `object_store::Error` or anything in its source
//! chain.

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may go without progress: from sending it until the
/// answer's headers, and then between two pieces of the answer's body.
pub const NO_PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a failed request is retried (connect errors, 5xx, 429; a
/// timeout only for reads) by publications and maintenance.
pub const MAX_RETRIES: usize = 4;
/// No retry starts once this long has passed since the first attempt.
pub const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// The client options of every s3 root: a bounded connect, a bounded wait
/// without progress, and no limit on a request that keeps making progress
/// (a large GET may take as long as it needs).
pub fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_read_timeout(NO_PROGRESS_TIMEOUT)
        .with_timeout_disabled()
}

/// One failed request, described from the error's structure alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection could be made (refused, unreachable, name unknown, TLS).
    Connect,
    /// No connection within [`CONNECT_TIMEOUT`] or no progress within
    /// [`NO_PROGRESS_TIMEOUT`].
    TimedOut,
    /// The connection broke off before the answer was complete.
    Broken,
    /// The answer could not be read.
    Unreadable,
    /// 401: the server does not accept the credentials.
    CredentialsRefused,
    /// 403: access denied (S3 also answers 403 to a wrong secret or an
    /// unknown key id).
    Denied,
    /// 404 where an object's absence is not an answer: the bucket.
    BucketMissing,
    /// Another publisher changed the key meanwhile (304, 409, 412).
    Changed(u16),
    /// Any other HTTP status.
    Status(u16),
    /// An error answer whose status is unknown (S3 can report `SlowDown` or
    /// `InternalError` inside a 200 answer).
    ServerError,
    /// The store does not support the operation.
    Unsupported,
    /// Not sent: the agent is stopping and the endpoint did not answer the
    /// request before (see [`GuardedConnector`]).
    NotSent,
    /// Anything else (an internal error of the client).
    Other,
}

impl Failure {
    /// The failure of `e`. `answer` is the status of the last error answer
    /// to the failed request, as [`answered`] saw it (`object_store` keeps
    /// the status of most answers inside a private type).
    pub fn of(e: &object_store::Error, answer: Option<u16>) -> Failure {
        use object_store::Error as E;
        match e {
            E::Unauthenticated { .. } => return Failure::CredentialsRefused,
            E::PermissionDenied { .. } => return Failure::Denied,
            E::NotFound { .. } => return Failure::BucketMissing,
            E::NotModified { .. } => return Failure::Changed(304),
            E::AlreadyExists { .. } => return Failure::Changed(409),
            E::Precondition { .. } => return Failure::Changed(412),
            E::NotImplemented { .. } | E::NotSupported { .. } => return Failure::Unsupported,
            _ => {}
        }
        if stopped_request(e) {
            return Failure::NotSent;
        }
        if let Some(kind) = transport_kind(e) {
            return Failure::of_kind(kind);
        }
        match (e, answer) {
            (E::Generic { .. }, Some(status)) => Failure::of_status(status),
            (E::Generic { .. }, None) => Failure::ServerError,
            _ => Failure::Other,
        }
    }

    /// The failure of a request this crate sent itself (no answer).
    pub fn of_http(e: &HttpError) -> Failure {
        Failure::of_kind(e.kind())
    }

    fn of_kind(kind: HttpErrorKind) -> Failure {
        match kind {
            HttpErrorKind::Connect => Failure::Connect,
            HttpErrorKind::Timeout => Failure::TimedOut,
            HttpErrorKind::Request | HttpErrorKind::Interrupted => Failure::Broken,
            HttpErrorKind::Decode => Failure::Unreadable,
            _ => Failure::Other,
        }
    }

    /// The failure an HTTP status means.
    pub fn of_status(status: u16) -> Failure {
        match status {
            401 => Failure::CredentialsRefused,
            403 => Failure::Denied,
            404 => Failure::BucketMissing,
            304 | 409 | 412 => Failure::Changed(status),
            _ => Failure::Status(status),
        }
    }

    /// Whether a later attempt may succeed without anyone changing
    /// anything: an unreachable, slow or overloaded server may recover;
    /// refused credentials, denied access and a missing bucket need the
    /// operator.
    pub fn is_transient(self) -> bool {
        match self {
            Failure::Connect
            | Failure::TimedOut
            | Failure::Broken
            | Failure::Unreadable
            | Failure::Changed(_)
            | Failure::NotSent
            | Failure::ServerError => true,
            Failure::Status(s) => s >= 500 || s == 429 || s == 408,
            Failure::CredentialsRefused
            | Failure::Denied
            | Failure::BucketMissing
            | Failure::Unsupported
            | Failure::Other => false,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let connect = CONNECT_TIMEOUT.as_secs();
        let idle = NO_PROGRESS_TIMEOUT.as_secs();
        match self {
            Failure::Connect => write!(
                f,
                "cannot connect to the endpoint (refused, unreachable, unknown name or TLS failure)"
            ),
            Failure::TimedOut => write!(
                f,
                "timed out: no connection within {connect} s or no progress for {idle} s"
            ),
            Failure::Broken => write!(f, "the connection broke off before the answer was complete"),
            Failure::Unreadable => write!(f, "the server's answer could not be read"),
            Failure::CredentialsRefused => write!(
                f,
                "credentials refused (HTTP 401): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN"
            ),
            Failure::Denied => write!(
                f,
                "access denied (HTTP 403): the server refused the credentials or does not allow them this operation on the bucket; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the bucket's permissions"
            ),
            Failure::BucketMissing => write!(
                f,
                "bucket missing (HTTP 404): the bucket does not exist on that server; correct `bucket` (and `endpoint`) in the config, or create the bucket"
            ),
            Failure::Changed(status) => write!(
                f,
                "the object changed meanwhile (HTTP {status}); another publisher wrote it"
            ),
            Failure::Status(status) if *status >= 500 => {
                write!(f, "server error (HTTP {status})")
            }
            Failure::Status(429) => write!(f, "the server is overloaded (HTTP 429, slow down)"),
            Failure::Status(status) if (300..400).contains(status) => write!(
                f,
                "the server redirected the request (HTTP {status}); check `endpoint` and `region`"
            ),
            Failure::Status(status) => write!(f, "the server refused the request (HTTP {status})"),
            Failure::ServerError => write!(
                f,
                "server error (an error inside a success answer, such as SlowDown or InternalError)"
            ),
            Failure::Unsupported => write!(f, "the server does not support this operation"),
            Failure::NotSent => write!(
                f,
                "not sent: the agent is stopping and the endpoint did not answer the request before"
            ),
            Failure::Other => write!(f, "the s3 client failed"),
        }
    }
}

/// The kind of the transport error in `e`'s source chain, if there is one.
fn transport_kind(e: &object_store::Error) -> Option<HttpErrorKind> {
    let mut current: &(dyn std::error::Error + 'static) = e;
    loop {
        if let Some(http) = current.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        current = current.source()?;
    }
}

/// Whether `e` is a request [`Guarded`] did not send.
fn stopped_request(e: &object_store::Error) -> bool {
    let mut current: &(dyn std::error::Error + 'static) = e;
    loop {
        if current.is::<NotSentWhileStopping>() {
            return true;
        }
        match current.source() {
            Some(next) => current = next,
            None => return false,
        }
    }
}

tokio::task_local! {
    /// The status of the last error answer seen in the current [`answered`]
    /// scope. Per task on purpose, not process-wide: it belongs to the
    /// requests made in that scope (docs/architecture.md, "What a process
    /// keeps").
    static ANSWER: Cell<Option<u16>>;
}

thread_local! {
    /// The status [`block_on`] saw last on this thread. Per thread on
    /// purpose: it belongs to the request just made on it
    /// (docs/architecture.md, "What a process keeps").
    static LAST: Cell<Option<u16>> = const { Cell::new(None) };
}

/// `runtime.block_on(f)`, remembering the status of the last error answer
/// for [`last_answer`].
pub fn block_on<F: Future>(runtime: &tokio::runtime::Runtime, f: F) -> F::Output {
    LAST.with(|last| last.set(None));
    let (out, answer) = runtime.block_on(answered(f));
    LAST.with(|last| last.set(answer));
    out
}

/// The status of the last error answer in the current [`answered`] scope,
/// or else of the last [`block_on`] on this thread.
pub fn last_answer() -> Option<u16> {
    ANSWER
        .try_with(Cell::get)
        .unwrap_or_else(|_| LAST.with(Cell::get))
}

/// Runs `request` and returns its output with the status of the last error
/// answer the server gave while it ran (retries included), if any.
pub async fn answered<F: Future>(request: F) -> (F::Output, Option<u16>) {
    ANSWER
        .scope(Cell::new(None), async {
            let out = request.await;
            (out, ANSWER.with(Cell::get))
        })
        .await
}

/// The HTTP client of every s3 root: `object_store`'s own reqwest client,
/// except that an error answer (any status but 2xx) reaches `object_store`
/// with its status and headers and an empty body. `object_store` decides
/// from the status alone (retry, not found, precondition failed); the body
/// only ever ended up in its error messages.
///
/// It also keeps a stop short: once the agent is stopping
/// ([`crate::runtime::interrupt`]) and the endpoint did not answer this client's
/// last request (no connection, or timed out), it sends nothing more
/// (neither retries nor clean-up), as if the process had been stopped
/// there; what a publication leaves behind is cleaned up by the next one
/// (docs/object-storage.md).
#[derive(Debug, Default)]
pub struct GuardedConnector;

impl HttpConnector for GuardedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Guarded {
            inner,
            unanswered: AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct Guarded {
    inner: HttpClient,
    /// The last request got no answer (connect error or timeout).
    unanswered: AtomicBool,
}

/// The error of a request [`Guarded`] did not send.
#[derive(Debug, thiserror::Error)]
#[error("not sent: stopping, and the endpoint did not answer")]
struct NotSentWhileStopping;

#[async_trait::async_trait]
impl HttpService for Guarded {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        if crate::runtime::interrupt::entered_abandoned() && self.unanswered.load(Ordering::Relaxed)
        {
            // Kind `Unknown`: `object_store` does not retry it.
            return Err(HttpError::new(HttpErrorKind::Unknown, NotSentWhileStopping));
        }
        let response = match self.inner.execute(req).await {
            Ok(response) => response,
            Err(e) => {
                if matches!(e.kind(), HttpErrorKind::Connect | HttpErrorKind::Timeout) {
                    self.unanswered.store(true, Ordering::Relaxed);
                }
                return Err(e);
            }
        };
        self.unanswered.store(false, Ordering::Relaxed);
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        // Outside an `answered` scope (a multipart part runs in a task of
        // its own) the status is not remembered.
        let _ = ANSWER.try_with(|answer| answer.set(Some(status.as_u16())));
        let (parts, _body) = response.into_parts();
        Ok(HttpResponse::from_parts(
            parts,
            HttpResponseBody::from(String::new()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(kind: HttpErrorKind) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(HttpError::new(kind, std::io::Error::other("x"))),
        }
    }

    fn generic() -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: "an error answer".into(),
        }
    }

    fn path_error(
        make: fn(String, Box<dyn std::error::Error + Send + Sync>) -> object_store::Error,
    ) -> object_store::Error {
        make("k".into(), "body".into())
    }

    #[test]
    fn errors_are_described_and_classified_from_their_structure() {
        use object_store::Error as E;
        let table: Vec<(object_store::Error, Option<u16>, Failure, bool)> = vec![
            (http(HttpErrorKind::Connect), None, Failure::Connect, true),
            (http(HttpErrorKind::Timeout), None, Failure::TimedOut, true),
            // A transport error wins over an earlier error answer.
            (
                http(HttpErrorKind::Timeout),
                Some(503),
                Failure::TimedOut,
                true,
            ),
            (http(HttpErrorKind::Request), None, Failure::Broken, true),
            (
                http(HttpErrorKind::Interrupted),
                None,
                Failure::Broken,
                true,
            ),
            (http(HttpErrorKind::Decode), None, Failure::Unreadable, true),
            (
                path_error(|path, source| E::Unauthenticated { path, source }),
                None,
                Failure::CredentialsRefused,
                false,
            ),
            (
                path_error(|path, source| E::PermissionDenied { path, source }),
                Some(403),
                Failure::Denied,
                false,
            ),
            (
                path_error(|path, source| E::NotFound { path, source }),
                Some(404),
                Failure::BucketMissing,
                false,
            ),
            (
                path_error(|path, source| E::Precondition { path, source }),
                Some(412),
                Failure::Changed(412),
                true,
            ),
            (generic(), Some(500), Failure::Status(500), true),
            (generic(), Some(503), Failure::Status(503), true),
            (generic(), Some(429), Failure::Status(429), true),
            (generic(), Some(408), Failure::Status(408), true),
            (generic(), Some(400), Failure::Status(400), false),
            (generic(), Some(301), Failure::Status(301), false),
            // A LIST answered 403 or 401 arrives as a generic error.
            (generic(), Some(403), Failure::Denied, false),
            (generic(), Some(401), Failure::CredentialsRefused, false),
            (generic(), Some(404), Failure::BucketMissing, false),
            // SlowDown inside a 200 answer: no error status was seen.
            (generic(), None, Failure::ServerError, true),
            (
                E::NotImplemented {
                    operation: "x".into(),
                    implementer: "y".into(),
                },
                None,
                Failure::Unsupported,
                false,
            ),
        ];
        for (error, answer, failure, transient) in table {
            let got = Failure::of(&error, answer);
            assert_eq!(got, failure, "{error:?} {answer:?}");
            assert_eq!(got.is_transient(), transient, "{got:?}");
        }
    }

    #[test]
    fn descriptions_say_what_happened_in_one_line_without_the_error_text() {
        let secret_body = "<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>AKIDSECRET</AWSAccessKeyId></Error>";
        let e = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: secret_body.into(),
        };
        for (failure, words) in [
            (Failure::of(&e, Some(403)), "access denied (HTTP 403)"),
            (Failure::Connect, "cannot connect"),
            (Failure::TimedOut, "timed out"),
            (Failure::CredentialsRefused, "credentials refused"),
            (Failure::BucketMissing, "bucket missing"),
            (Failure::Status(503), "server error (HTTP 503)"),
            (Failure::Status(429), "HTTP 429"),
        ] {
            let text = failure.to_string();
            assert!(text.contains(words), "{text}");
            assert!(!text.contains('\n'), "{text}");
            assert!(!text.contains("AKIDSECRET"), "{text}");
        }
    }
}
