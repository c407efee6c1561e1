//! One error type for the whole crate. Every variant names the thing that was wrong
//! (a file, a tensor, a config key, an op) so a user can act on the message alone.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read, or its contents are malformed.
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },

    /// A checkpoint tensor is missing, unexpected, mis-shaped or of the wrong dtype.
    #[error("tensor `{name}`: {msg}")]
    Tensor { name: String, msg: String },

    /// A config.json key is missing or holds an invalid value.
    #[error("config key `{key}`: {msg}")]
    Config { key: String, msg: String },

    /// An image could not be decoded or is unusable.
    #[error("image {path}: {msg}")]
    Image { path: PathBuf, msg: String },

    /// The lane was asked for an op or an operand format it does not implement.
    #[error("the {lane} lane does not support op `{op}` with {what}")]
    Unsupported { lane: &'static str, op: &'static str, what: String },

    /// Operands of an op do not fit together.
    #[error("op `{op}`: {msg}")]
    Shape { op: &'static str, msg: String },

    /// The device (adapter, driver, allocation) failed.
    #[error("device: {0}")]
    Device(String),

    /// A command-line or API argument is invalid.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::File { path: path.into(), msg: msg.into() }
    }
    pub fn tensor(name: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Tensor { name: name.into(), msg: msg.into() }
    }
    pub fn config(key: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config { key: key.into(), msg: msg.into() }
    }
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape { op, msg: msg.into() }
    }
}
