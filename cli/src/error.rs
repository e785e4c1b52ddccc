//! The command's errors: one line, a stable kind, and an exit code.

use std::fmt;

use throttlegate::ErrorKind;

/// Exit code of a successful run (and of an allowed `check`/`peek`).
pub const EXIT_OK: u8 = 0;
/// Exit code of a `check`/`peek` whose request is denied.
pub const EXIT_DENIED: u8 = 1;
/// Exit code of bad input: arguments, policy or scenario files.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of a backend that is unreachable, too slow or failing.
pub const EXIT_BACKEND: u8 = 3;
/// Exit code of a bug.
pub const EXIT_INTERNAL: u8 = 4;

/// An error of the command line tool.
#[derive(Debug, Clone)]
pub struct CliError {
    /// Stable id: the core's `ErrorKind::as_str()` or `"usage"`.
    pub kind: &'static str,
    /// What is wrong, naming the argument, file or field.
    pub message: String,
    /// The process exit code.
    pub exit: u8,
}

impl CliError {
    /// Bad command-line input or a bad scenario file.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError {
            kind: "usage",
            message: message.into(),
            exit: EXIT_USAGE,
        }
    }

    /// One line, whatever the message holds (errors from parsers may span lines).
    pub fn one_line(&self) -> String {
        let text: Vec<&str> = self.message.split_whitespace().collect();
        text.join(" ")
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.one_line())
    }
}

impl From<throttlegate::Error> for CliError {
    fn from(e: throttlegate::Error) -> CliError {
        let exit = match e.kind() {
            ErrorKind::InvalidPolicy | ErrorKind::InvalidArgument | ErrorKind::Io => EXIT_USAGE,
            ErrorKind::BackendUnavailable | ErrorKind::Timeout | ErrorKind::Backend => EXIT_BACKEND,
            _ => EXIT_INTERNAL,
        };
        CliError {
            kind: e.kind().as_str(),
            message: e.to_string(),
            exit,
        }
    }
}

/// `Result` with [`CliError`].
pub type CliResult<T> = Result<T, CliError>;
