//! [`WatchCursor`]: where a prefix watch of every partition resumes, one
//! index per partition.

use std::fmt;
use std::str::FromStr;

/// Where a watch of every partition resumes: the last index read of each
/// partition, in partition order (empty: from the start). Written and read
/// as `I0,I1,...`, the form of `GET /v1/watch?indexes=`.
///
/// A cursor of one index that no partitioned stream moved (a cluster of
/// one partition) resumes as `index=I`, which nodes from before
/// partitioned watches understand too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchCursor {
    indexes: Vec<u64>,
    /// Moved by a line that named its partition, or made of several
    /// indexes: resumed as `indexes=`.
    partitioned: bool,
}

impl WatchCursor {
    /// A cursor at the given indexes, partition 0's first.
    pub fn new(indexes: Vec<u64>) -> Self {
        Self {
            partitioned: indexes.len() > 1,
            indexes,
        }
    }

    /// The last index read of `partition` (0: none).
    pub fn index_of(&self, partition: usize) -> u64 {
        self.indexes.get(partition).copied().unwrap_or(0)
    }

    /// Every partition's index, partition 0's first.
    pub fn indexes(&self) -> &[u64] {
        &self.indexes
    }

    /// The query that resumes from here: none (from the start),
    /// `&index=I` (one partition), or `&indexes=I0,I1,...`.
    pub(crate) fn query(&self) -> String {
        match self.indexes.as_slice() {
            [] => String::new(),
            [index] if !self.partitioned => format!("&index={index}"),
            _ => format!("&indexes={self}"),
        }
    }

    /// Moves `partition` on to `index` (never back); `named` when the line
    /// named its partition.
    pub(crate) fn advance(&mut self, partition: usize, index: u64, named: bool) {
        if self.indexes.len() <= partition {
            self.indexes.resize(partition + 1, 0);
        }
        self.indexes[partition] = self.indexes[partition].max(index);
        self.partitioned |= named || self.indexes.len() > 1;
    }
}

impl fmt::Display for WatchCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for index in &self.indexes {
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
            .map(Self::new)
            .map_err(|_| format!("{text:?} is not a list of indexes like 12,0,7"))
    }
}
