use std::time::Duration;

/// What can go wrong starting or driving local nodes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process (or its log file) could not be created.
    #[error("cannot start {name}")]
    Spawn {
        /// The node, as [`crate::NodeSpec::name`] says.
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The node did not print its `listening on` line in time.
    #[error("{name} did not start listening within {timeout:?}")]
    NotListening {
        /// The node.
        name: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The node closed its stdout (it exited) before it was listening.
    #[error("{name} exited before it was listening")]
    ExitedEarly {
        /// The node.
        name: String,
    },
    /// The node is not running (it was killed and not started again).
    #[error("{name} is not running")]
    NotRunning {
        /// The node.
        name: String,
    },
    /// A signal could not be delivered.
    #[error("cannot signal {name}")]
    Signal {
        /// The node.
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// `palisade certs init` did not run or failed (its stderr says why).
    #[error("palisade certs init failed: {0}")]
    Certs(String),
    /// No free ports to choose from.
    #[error("cannot choose free ports")]
    Ports(#[source] std::io::Error),
}
