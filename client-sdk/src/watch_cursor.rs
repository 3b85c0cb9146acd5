//! [`WatchCursor`]: where a prefix watch of every partition resumes, one
//! index per partition.

use std::fmt;
use std::str::FromStr;

/// Where a watch of every partition resumes: the last index read of each
/// partition, in partition order (empty: from the start). Written and read
/// as `I0,I1,...`, the form of `GET /v1/watch?indexes=`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchCursor(Vec<u64>);

impl WatchCursor {
    /// A cursor at the given indexes, partition 0's first.
    pub fn new(indexes: Vec<u64>) -> Self {
        Self(indexes)
    }

    /// The last index read of `partition` (0: none).
    pub fn index_of(&self, partition: usize) -> u64 {
        self.0.get(partition).copied().unwrap_or(0)
    }

    /// Every partition's index, partition 0's first.
    pub fn indexes(&self) -> &[u64] {
        &self.0
    }

    /// Moves `partition` on to `index` (never back).
    pub(crate) fn advance(&mut self, partition: usize, index: u64) {
        if self.0.len() <= partition {
            self.0.resize(partition + 1, 0);
        }
        self.0[partition] = self.0[partition].max(index);
    }
}

impl fmt::Display for WatchCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for index in &self.0 {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{index}")?;
        }
        Ok(())
    }
}

impl FromStr for WatchCursor {
    type Err = String;

    /// `I0,I1,...` (whole numbers, comma-separated; empty: from the start).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        text.split(',')
            .map(|index| index.trim().parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
            .map_err(|_| format!("{text:?} is not a list of indexes like 12,0,7"))
    }
}
