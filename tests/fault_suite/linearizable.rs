//! A linearizability checker for one register (one key), after Wing & Gong
//! with Lowe's memoization (the algorithm Knossos and Porcupine use): search
//! for an order of the operations that respects real time (an operation that
//! completed before another was invoked comes first) and the register's
//! semantics (a read returns the last write before it, or nothing).
//!
//! An operation whose outcome is unknown (the client saw a transport error)
//! has no completion time: it may take effect at any point after its invoke,
//! or never.

use std::collections::HashSet;

/// What an operation did; values are ids (the caller interns the strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Write(u32),
    /// A read and what it returned (`None`: the key was absent).
    Read(Option<u32>),
}

/// One operation on the register, timed on one clock.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub invoke: u64,
    /// `u64::MAX`: the outcome is unknown.
    pub complete: u64,
    pub kind: Kind,
}

/// Why a history is not linearizable (or could not be decided).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order exists; `op` is an operation the search could never place
    /// (at its deepest point): usually the stale read.
    Not {
        op: usize,
    },
    /// The search gave up after `steps` steps.
    Undecided {
        steps: u64,
    },
}

const NONE: usize = usize::MAX;
const STEP_BUDGET: u64 = 20_000_000;

/// Decides whether `ops` on a register that starts absent are linearizable.
pub fn check(ops: &[Op]) -> Verdict {
    let n = ops.len();
    // Entries 0..n are calls, n..2n returns; `head` is the list's sentinel.
    let head = 2 * n;
    let mut order: Vec<usize> = (0..2 * n).collect();
    let time = |e: usize| {
        if e < n {
            (ops[e].invoke, 0)
        } else {
            // Calls sort before returns at equal times: the permissive reading.
            (ops[e - n].complete, 1)
        }
    };
    order.sort_by_key(|&e| time(e));
    let mut next = vec![NONE; 2 * n + 1];
    let mut prev = vec![NONE; 2 * n + 1];
    let mut last = head;
    for &e in &order {
        next[last] = e;
        prev[e] = last;
        last = e;
    }

    let lift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        for e in [call, call + n] {
            next[prev[e]] = next[e];
            if next[e] != NONE {
                prev[next[e]] = prev[e];
            }
        }
    };
    let unlift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        for e in [call + n, call] {
            next[prev[e]] = e;
            if next[e] != NONE {
                prev[next[e]] = e;
            }
        }
    };

    let mut linearized = vec![0u64; n.div_ceil(64)];
    let mut state: Option<u32> = None;
    let mut stack: Vec<(usize, Option<u32>)> = Vec::new();
    let mut cache: HashSet<(Vec<u64>, Option<u32>)> = HashSet::new();
    let mut deepest = (0, 0);
    let mut steps = 0u64;
    let mut entry = next[head];
    while next[head] != NONE {
        steps += 1;
        if steps > STEP_BUDGET {
            return Verdict::Undecided { steps };
        }
        if entry < n {
            let (legal, after) = match ops[entry].kind {
                Kind::Write(v) => (true, Some(v)),
                Kind::Read(seen) => (seen == state, state),
            };
            if legal {
                linearized[entry / 64] |= 1 << (entry % 64);
                if cache.insert((linearized.clone(), after)) {
                    stack.push((entry, state));
                    state = after;
                    lift(&mut next, &mut prev, entry);
                    entry = next[head];
                    continue;
                }
                linearized[entry / 64] &= !(1 << (entry % 64));
            }
            entry = next[entry];
        } else {
            // The return of an operation not yet placed: backtrack.
            if stack.len() >= deepest.0 {
                deepest = (stack.len(), entry - n);
            }
            let Some((call, before)) = stack.pop() else {
                return Verdict::Not { op: deepest.1 };
            };
            state = before;
            linearized[call / 64] &= !(1 << (call % 64));
            unlift(&mut next, &mut prev, call);
            entry = next[call];
        }
    }
    Verdict::Linearizable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(invoke: u64, complete: u64, kind: Kind) -> Op {
        Op {
            invoke,
            complete,
            kind,
        }
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let ops = [
            op(0, 1, Kind::Read(None)),
            op(2, 3, Kind::Write(1)),
            op(4, 5, Kind::Read(Some(1))),
            op(6, 7, Kind::Write(2)),
            op(8, 9, Kind::Read(Some(2))),
        ];
        assert_eq!(check(&ops), Verdict::Linearizable);
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        for seen in [Some(1), Some(2)] {
            let ops = [
                op(0, 1, Kind::Write(1)),
                op(2, 6, Kind::Write(2)),
                op(3, 4, Kind::Read(seen)),
            ];
            assert_eq!(check(&ops), Verdict::Linearizable);
        }
    }

    #[test]
    fn stale_read_after_a_completed_write_is_caught() {
        let ops = [
            op(0, 1, Kind::Write(1)),
            op(2, 3, Kind::Write(2)),
            op(4, 5, Kind::Read(Some(1))),
        ];
        assert_eq!(check(&ops), Verdict::Not { op: 2 });
    }

    #[test]
    fn reads_going_back_in_time_are_caught() {
        // Both reads overlap the write, but once one has seen the new value
        // a later one must not see the old.
        let ops = [
            op(0, 1, Kind::Write(1)),
            op(2, 10, Kind::Write(2)),
            op(3, 4, Kind::Read(Some(2))),
            op(5, 6, Kind::Read(Some(1))),
        ];
        assert!(matches!(check(&ops), Verdict::Not { .. }));
    }

    #[test]
    fn an_unknown_write_may_take_effect_late_or_never() {
        let seen_late = [
            op(0, 1, Kind::Write(1)),
            op(2, u64::MAX, Kind::Write(2)),
            op(3, 4, Kind::Read(Some(1))),
            op(50, 51, Kind::Read(Some(2))),
        ];
        assert_eq!(check(&seen_late), Verdict::Linearizable);
        // ...but not before it was invoked.
        let seen_early = [
            op(0, 1, Kind::Write(1)),
            op(3, 4, Kind::Read(Some(2))),
            op(5, u64::MAX, Kind::Write(2)),
        ];
        assert!(matches!(check(&seen_early), Verdict::Not { .. }));
    }

    #[test]
    fn a_value_nobody_wrote_is_caught() {
        let ops = [op(0, 1, Kind::Write(1)), op(2, 3, Kind::Read(Some(7)))];
        assert!(matches!(check(&ops), Verdict::Not { .. }));
    }
}
