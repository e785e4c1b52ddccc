//! The one error type of throttlegate, shared by every front end.
//!
//! Each [`ErrorKind`] has a stable string id ([`ErrorKind::as_str`]) used as the
//! Node `code` and the Python exception class, and a stable number
//! ([`ErrorKind::code`]) used by the C API. Numbers are never reused.

use std::fmt;
use std::sync::Arc;

/// What went wrong, independent of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A policy (from code, a file or a string) is malformed; the message names the field.
    InvalidPolicy,
    /// An argument of a call is invalid (cost, attributes, URL, option); the message names it.
    InvalidArgument,
    /// A file could not be read.
    Io,
    /// The backend could not be reached or the connection was lost.
    BackendUnavailable,
    /// The call did not complete within the configured timeout.
    Timeout,
    /// The backend answered with an error (out of memory, missing permission, script error).
    Backend,
    /// The limiter was closed.
    Closed,
    /// A bug in throttlegate (for example a caught panic). Please report it.
    Internal,
}

impl ErrorKind {
    /// Every kind, in the order of their numbers.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::InvalidPolicy,
        ErrorKind::InvalidArgument,
        ErrorKind::Io,
        ErrorKind::BackendUnavailable,
        ErrorKind::Timeout,
        ErrorKind::Backend,
        ErrorKind::Closed,
        ErrorKind::Internal,
    ];

    /// Stable identifier, e.g. `"invalid_policy"`. Never changes once released.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidPolicy => "invalid_policy",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Io => "io",
            ErrorKind::BackendUnavailable => "backend_unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Backend => "backend",
            ErrorKind::Closed => "closed",
            ErrorKind::Internal => "internal",
        }
    }

    /// Stable number (the C API's result code). `0` is success and is never an error.
    pub fn code(self) -> u32 {
        match self {
            ErrorKind::InvalidPolicy => 1,
            ErrorKind::InvalidArgument => 2,
            ErrorKind::Io => 3,
            ErrorKind::BackendUnavailable => 4,
            ErrorKind::Timeout => 5,
            ErrorKind::Backend => 6,
            ErrorKind::Closed => 7,
            ErrorKind::Internal => 8,
        }
    }

    /// True for failures of the backend (the ones `on_backend_error` applies to):
    /// unreachable, too slow, or answering with an error.
    pub fn is_backend_failure(self) -> bool {
        matches!(
            self,
            ErrorKind::BackendUnavailable | ErrorKind::Timeout | ErrorKind::Backend
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error: a kind, a message naming what is wrong, and an optional source.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    temporary: bool,
    wrong_type: bool,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result` with throttlegate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            temporary: matches!(kind, ErrorKind::BackendUnavailable | ErrorKind::Timeout),
            wrong_type: false,
            source: None,
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Mark whether retrying later may succeed.
    pub fn set_temporary(mut self, temporary: bool) -> Self {
        self.temporary = temporary;
        self
    }

    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when the same call may succeed later (connection lost, timeout).
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    pub(crate) fn invalid_policy(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidPolicy, message)
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// An [`ErrorKind::InvalidArgument`] error for a value of the wrong type
    /// (see [`Error::is_wrong_type`]).
    pub(crate) fn wrong_type(message: impl Into<String>) -> Self {
        Error { wrong_type: true, ..Error::invalid_argument(message) }
    }

    /// True for an [`ErrorKind::InvalidArgument`] error about a value's type
    /// rather than its value (Python raises these as a `TypeError` too).
    pub fn is_wrong_type(&self) -> bool {
        self.wrong_type
    }

    /// Run `f`, turning a panic into [`Error::from_panic`]: the guard of
    /// every front end's entry points.
    pub fn catch_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| Err(Error::from_panic(p.as_ref())))
    }

    /// The error of every call on a closed limiter.
    pub fn closed() -> Self {
        Error::new(ErrorKind::Closed, "the limiter is closed")
    }

    /// The error of a call that ran out of `timeout`.
    pub(crate) fn timeout(timeout: std::time::Duration) -> Self {
        Error::new(
            ErrorKind::Timeout,
            format!("the backend did not answer within the timeout ({} ms)", timeout.as_millis()),
        )
    }

    /// The error of a check that reached Redis after its deadline: the
    /// script changed nothing (the caller has had its timeout by then).
    pub(crate) fn expired() -> Self {
        Error::new(
            ErrorKind::Timeout,
            "the check reached the backend after its deadline (the timeout) and changed nothing",
        )
    }

    /// An [`ErrorKind::Internal`] error for a caught panic, with its text:
    /// what every front end reports instead of letting a panic cross into
    /// its language.
    pub fn from_panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let text = if let Some(s) = payload.downcast_ref::<&str>() {
            s
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.as_str()
        } else {
            "unknown panic"
        };
        Error::internal(text)
    }

    /// An [`ErrorKind::Internal`] error: a bug, worded the same in every
    /// language (`a bug in throttlegate (please report it): ...`).
    pub fn internal(what: impl std::fmt::Display) -> Self {
        Error::new(ErrorKind::Internal, format!("a bug in throttlegate (please report it): {what}"))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if self.temporary {
            d.field("temporary", &true);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(source) = &self.source {
            let text = source.to_string();
            if !text.is_empty() && !self.message.contains(&text) {
                write!(f, ": {text}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        use redis::ErrorKind as K;
        if let Some(tls) = tls_failure(&err) {
            // A certificate the client does not trust (or a handshake the
            // server refuses) will not get better by retrying.
            return Error::new(ErrorKind::Backend, format!("TLS with redis failed: {tls}"))
                .set_temporary(false)
                .with_source(err);
        }
        if let Some(cause) = scripts_refused(&err) {
            return Error::new(ErrorKind::Backend, scripts_refused_message(cause))
                .set_temporary(false)
                .with_source(err);
        }
        let unavailable = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
            || matches!(
                err.kind(),
                K::ClusterConnectionNotFound
                    | K::Server(redis::ServerErrorKind::BusyLoading)
                    | K::Server(redis::ServerErrorKind::ClusterDown)
                    | K::Server(redis::ServerErrorKind::MasterDown)
                    | K::Server(redis::ServerErrorKind::TryAgain)
            );
        let kind = if err.is_timeout() {
            ErrorKind::Timeout
        } else if unavailable {
            ErrorKind::BackendUnavailable
        } else if matches!(err.kind(), K::InvalidClientConfig) {
            ErrorKind::InvalidArgument
        } else {
            ErrorKind::Backend
        };
        let message = if err.is_timeout() {
            "redis did not answer in time".to_string()
        } else if unavailable {
            "redis is unavailable".to_string()
        } else {
            "redis answered with an error".to_string()
        };
        Error::new(kind, message)
            .set_temporary(unavailable || err.is_timeout())
            .with_source(err)
    }
}

/// Why a server refuses to run the check script, when that is what an
/// error says: its user lacks the permission (`NOPERM` from an ACL denying
/// `EVALSHA`, `EVAL` or `SCRIPT`), the command is unknown (renamed or
/// removed), or the server has no Lua engine (Valkey 9.1 with its Lua
/// module left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptsRefused {
    NoPermission,
    UnknownCommand,
    NoLua,
}

/// The cause of a refused script in `err`, if that is what it is.
pub(crate) fn scripts_refused(err: &redis::RedisError) -> Option<ScriptsRefused> {
    let text = format!("{} {}", err.code().unwrap_or(""), err.detail().unwrap_or("")).to_lowercase();
    let text = if text.trim().is_empty() { err.to_string().to_lowercase() } else { text };
    let scripting = ["'evalsha'", "'eval'", "'script", "`evalsha`", "`eval`", "`script", "'fcall"]
        .iter()
        .any(|c| text.contains(c));
    if matches!(err.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)) || text.starts_with("noperm") {
        return scripting.then_some(ScriptsRefused::NoPermission);
    }
    if text.contains("unknown command") && scripting {
        return Some(ScriptsRefused::UnknownCommand);
    }
    // An error raised while the script runs is the script's, not the engine's.
    if text.contains("user_script") || text.contains("error running script") {
        return None;
    }
    let lua = text.contains("lua") || text.contains("engine");
    // Valkey 9.1 without its Lua module: "Could not find scripting engine 'lua'".
    let missing = text.contains("not found")
        || text.contains("could not find")
        || text.contains("not loaded")
        || text.contains("unknown engine");
    (lua && missing).then_some(ScriptsRefused::NoLua)
}

/// The one message of a refused script: the cause and the fix.
fn scripts_refused_message(cause: ScriptsRefused) -> String {
    let what = match cause {
        ScriptsRefused::NoPermission => "the URL's user may not run Lua scripts (NOPERM: an ACL denies EVALSHA/EVAL)",
        ScriptsRefused::UnknownCommand => "the server does not know EVALSHA/EVAL (the commands are renamed or disabled)",
        ScriptsRefused::NoLua => "the server has no Lua engine (its Lua module is not loaded)",
    };
    format!(
        "redis refuses scripts: {what}; throttlegate decides every check in one Lua script, so the server must run it: \
         grant the user `+evalsha +eval +script|load` (ACL SETUSER <user> +evalsha +eval +script|load), \
         keep the commands enabled (no rename-command), and on Valkey 9.1+ load the Lua module (loadmodule <path>/libvalkeylua.so)"
    )
}

/// The TLS failure inside a Redis client error, if that is what it is.
///
/// The client keeps its I/O errors behind an `Arc<dyn Error>`, which hides
/// their type from `downcast_ref`, so the TLS library's messages are
/// recognised by their text as a fallback.
fn tls_failure(err: &redis::RedisError) -> Option<String> {
    const MARKERS: &[&str] = &[
        "invalid peer certificate",
        "received fatal alert",
        "peer is incompatible",
        "peer misbehaved",
        "certificate",
    ];
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        let text = e.to_string();
        if MARKERS.iter().any(|m| text.contains(m)) {
            return Some(text);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_scripts_are_told_from_other_errors() {
        let server = |code: &str, detail: &str| {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                format!("{code} {detail}"),
            ))
        };
        let noperm = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NoPerm",
            "this user has no permissions to run the 'evalsha' command".to_string(),
        ));
        assert_eq!(scripts_refused(&noperm), Some(ScriptsRefused::NoPermission));
        let unknown = server(
            "ERR",
            "unknown command 'evalsha', with args beginning with: 'abc'",
        );
        assert_eq!(
            scripts_refused(&unknown),
            Some(ScriptsRefused::UnknownCommand)
        );
        let no_lua = server("ERR", "Could not find scripting engine 'lua'");
        assert_eq!(scripts_refused(&no_lua), Some(ScriptsRefused::NoLua));
        // A script's own error, a permission on a key, another unknown command: not refused scripts.
        assert_eq!(
            scripts_refused(&server("ERR", "user_script:12: table not found")),
            None
        );
        let key = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NoPerm",
            "No permissions to access a key".to_string(),
        ));
        assert_eq!(scripts_refused(&key), None);
        assert_eq!(
            scripts_refused(&server("ERR", "unknown command 'foo'")),
            None
        );
        let e = Error::from(noperm);
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert!(
            e.message()
                .contains("ACL SETUSER <user> +evalsha +eval +script|load"),
            "{e}"
        );
    }
}
