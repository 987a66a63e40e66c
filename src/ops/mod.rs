//! What operators see, reading the mirror's shared state and never writing to the data path:
//! [`metrics`] (Prometheus) and [`health`] over HTTP, [`progress`] lines in the log, systemd
//! notification ([`notify`]), and the log set-up ([`logging`]).

pub mod health;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod progress;
