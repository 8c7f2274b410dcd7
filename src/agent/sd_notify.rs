//! The systemd notification protocol (`sd_notify(3)`), the few lines of it
//! the agent needs: `READY=1` once it serves, `STATUS=` with a one-line
//! summary, `WATCHDOG=1` every half `WATCHDOG_USEC`, `RELOADING=1` and
//! `STOPPING=1`. Each message is one datagram to the `AF_UNIX` socket named
//! by `NOTIFY_SOCKET` (a path, or an abstract name written with a leading
//! `@`). Without `NOTIFY_SOCKET` (not started by systemd with
//! `Type=notify`) every call does nothing. Sending never fails the agent: a
//! lost notification is logged once at debug level and forgotten.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where notifications go, read once from the environment.
#[derive(Debug)]
pub(super) struct Notifier {
    socket: Option<(UnixDatagram, NotifySocket)>,
    watchdog: Option<Duration>,
}

/// The address of systemd's notification socket: a path, or an
/// abstract name (`@...`).
#[derive(Debug, Clone)]
enum NotifySocket {
    Path(std::path::PathBuf),
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub(super) fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|s| parse_target(&s));
        let socket = target.and_then(|t| match UnixDatagram::unbound() {
            Ok(s) => Some((s, t)),
            Err(e) => {
                log::warn!("cannot create a socket for systemd notifications: {e}");
                None
            }
        });
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Notifier { socket, watchdog }
    }

    /// How often to send `WATCHDOG=1`, when systemd asks for it.
    pub(super) fn watchdog(&self) -> Option<Duration> {
        self.watchdog.filter(|_| self.socket.is_some())
    }

    /// True when notifications go somewhere.
    pub(super) fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends `state` (newline-separated `KEY=value` lines).
    pub(super) fn send(&self, state: &str) {
        let Some((socket, target)) = &self.socket else {
            return;
        };
        let sent = match target {
            NotifySocket::Path(path) => socket.send_to(state.as_bytes(), path),
            NotifySocket::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
            }
        };
        if let Err(e) = sent {
            log::debug!("cannot send {state:?} to NOTIFY_SOCKET: {e}");
        }
    }
}

/// `NOTIFY_SOCKET`: an absolute path, or `@name` for an abstract socket.
fn parse_target(value: &std::ffi::OsStr) -> Option<NotifySocket> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = value.as_bytes();
    match bytes.first()? {
        b'@' => Some(NotifySocket::Abstract(bytes[1..].to_vec())),
        b'/' => Some(NotifySocket::Path(std::path::PathBuf::from(value))),
        _ => None,
    }
}

/// Half of `WATCHDOG_USEC`, if it is set, positive, and meant for this
/// process (`WATCHDOG_PID` absent or equal to `pid`).
fn watchdog_interval(usec: Option<&str>, for_pid: Option<&str>, pid: u32) -> Option<Duration> {
    if let Some(p) = for_pid
        && p.trim().parse::<u32>().ok() != Some(pid)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

/// The `STATUS=` line: what is served and how bundles ended since start.
/// `CLOCK_MONOTONIC` in microseconds, as `RELOADING=1` wants it in
/// `MONOTONIC_USEC=` (sd_notify(3)).
pub(super) fn monotonic_usec() -> u128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u128 * 1_000_000 + t.tv_nsec as u128 / 1_000
}

pub(super) fn status_line(serving: usize, configured: usize, done: u64, failed: u64) -> String {
    format!(
        "serving {serving} of {configured} pipeline(s); {done} bundle(s) done, {failed} failed since start"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn watchdog_is_half_the_interval_and_only_for_this_process() {
        let cases: [(Option<&str>, Option<&str>, Option<Duration>); 7] = [
            (None, None, None),
            (Some("20000000"), None, Some(Duration::from_secs(10))),
            (Some("20000000"), Some("42"), Some(Duration::from_secs(10))),
            (Some("20000000"), Some("43"), None),
            (Some("0"), None, None),
            (Some("soon"), None, None),
            (Some("3"), Some("x"), None),
        ];
        for (usec, for_pid, want) in cases {
            assert_eq!(
                watchdog_interval(usec, for_pid, 42),
                want,
                "{usec:?} {for_pid:?}"
            );
        }
    }

    #[test]
    fn notify_socket_is_a_path_or_an_abstract_name() {
        assert!(matches!(
            parse_target(OsStr::new("/run/systemd/notify")),
            Some(NotifySocket::Path(p)) if p == std::path::Path::new("/run/systemd/notify")
        ));
        assert!(matches!(
            parse_target(OsStr::new("@sd-notify-1")),
            Some(NotifySocket::Abstract(n)) if n == b"sd-notify-1"
        ));
        assert!(parse_target(OsStr::new("")).is_none());
        assert!(parse_target(OsStr::new("relative/sock")).is_none());
    }

    #[test]
    fn a_message_reaches_a_bound_socket_by_path_and_by_abstract_name() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("notify.sock");
        let by_path = UnixDatagram::bind(&path).unwrap();
        let name = format!("distributor-notify-test-{}", std::process::id());
        let by_name = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        };
        for (target, socket) in [
            (NotifySocket::Path(path.clone()), &by_path),
            (NotifySocket::Abstract(name.into_bytes()), &by_name),
        ] {
            let n = Notifier {
                socket: Some((UnixDatagram::unbound().unwrap(), target)),
                watchdog: None,
            };
            n.send("READY=1\nSTATUS=x");
            let mut buf = [0u8; 64];
            let len = socket.recv(&mut buf).unwrap();
            assert_eq!(&buf[..len], b"READY=1\nSTATUS=x");
        }
    }
}
