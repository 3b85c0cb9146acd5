//! The replicated state: the lease table, the commands that change it and
//! their pure, deterministic apply — one file per kind of command, behind
//! the short dispatch in [`table`].

mod acquire;
pub mod command;
mod ending;
pub mod history;
mod keys;
pub mod record;
pub mod stamp;
pub mod table;

#[cfg(test)]
mod tests;
