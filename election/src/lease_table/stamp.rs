//! [`Stamp`]: what a [`Command::Stamped`] entry carries beside its command —
//! the proposer's clock and the history bound — and the methods that wrap
//! a command in one and unwrap it.

use super::command::Command;
use super::history::HISTORY_LEN;

/// What a [`Command::Stamped`] entry says beside its command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The proposer's clock (ms since the Unix epoch); `None`: unstamped.
    pub at_ms: Option<u64>,
    /// The history bound the proposer stamped; `None`: the default.
    pub history_len: Option<u16>,
}

impl Stamp {
    /// How many transitions to keep: the stamped bound (at least 1), else
    /// [`HISTORY_LEN`].
    pub fn history_len(&self) -> usize {
        self.history_len
            .map_or(HISTORY_LEN, |n| usize::from(n.max(1)))
    }
}

impl Command {
    /// `self`, stamped with `at_ms` and no history bound (the default
    /// one): what entries of earlier versions carry.
    pub fn stamped(self, at_ms: u64) -> Self {
        self.stamped_with(at_ms, None)
    }

    /// `self`, stamped with `at_ms` and the history bound `history_len` (a
    /// stamped command keeps its stamp).
    pub fn stamped_with(self, at_ms: u64, history_len: Option<u16>) -> Self {
        match self {
            Command::Stamped { .. } => self,
            command => Command::Stamped {
                at_ms,
                history_len,
                command: Box::new(command),
            },
        }
    }

    /// The stamp (empty for a bare command) and the bare command.
    pub fn unstamped(&self) -> (Stamp, &Command) {
        match self {
            Command::Stamped {
                at_ms,
                history_len,
                command,
            } => {
                let stamp = Stamp {
                    at_ms: Some(*at_ms),
                    history_len: *history_len,
                };
                (stamp, command.unstamped().1)
            }
            command => (Stamp::default(), command),
        }
    }
}
