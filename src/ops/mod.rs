//! What operators see, reading the mirror's shared state and never writing to the data path:
//! [`metrics`] (Prometheus) and [`health`] over HTTP, [`progress`] lines in the log, systemd
//! notification ([`notify`]), the log set-up ([`logging`]), and [`signals`] with the shutdown
//! watchdog.

pub mod health;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod progress;
pub mod signals;
