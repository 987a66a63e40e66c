//! The subcommands besides the mirror itself: [`check`] (validate, connect, show what would
//! be mirrored), [`verify`] (compare source and target record by record), [`demo`] (two
//! embedded clusters), and the record reading and comparison they and the tests share
//! ([`compare`]).

pub mod check;
pub mod compare;
pub mod demo;
pub mod verify;
