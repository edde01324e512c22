//! The error of every setting the core checks: a route pattern, a status list, a scope
//! rule, a JSON pointer, a problem base, an edge secret…

use alloc::string::String;
use core::fmt;

/// A setting that can't be used. Its message says which setting and why, in words
/// an operator can act on; it is all there is to it (no cause: the core checks values,
/// it reads nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSetting {
    message: String,
}

impl InvalidSetting {
    /// A setting refused, `message` saying why.
    pub fn new(message: impl Into<String>) -> Self {
        InvalidSetting {
            message: message.into(),
        }
    }

    /// Why it was refused.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for InvalidSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl core::error::Error for InvalidSetting {}

impl From<String> for InvalidSetting {
    fn from(message: String) -> Self {
        InvalidSetting { message }
    }
}

impl From<&str> for InvalidSetting {
    fn from(message: &str) -> Self {
        InvalidSetting::new(message)
    }
}

/// For callers that report settings as text (a CLI's argument parser).
impl From<InvalidSetting> for String {
    fn from(e: InvalidSetting) -> String {
        e.message
    }
}
