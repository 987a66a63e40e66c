//! The subcommands besides the mirror itself: [`check`] (validate, connect, show what would
//! be mirrored), [`verify`] (compare source and target record by record), [`demo`] (two
//! embedded clusters), [`translate`] (a group's offsets through the offset mapping), and the
//! record reading and comparison they and the tests share
//! ([`compare`]).

pub mod check;
pub mod compare;
pub mod demo;
pub mod translate;
pub mod verify;
