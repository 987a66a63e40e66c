//! `mirror-maker`: exit codes 0 (clean shutdown), 1 (runtime failure), 2 (bad usage or
//! configuration).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use mirror_maker::cli::{Cli, Command, MirrorArgs};
use mirror_maker::control::{Control, Stats};
use mirror_maker::settings::Settings;
use mirror_maker::{demo, logging, metrics, pipeline};

const RUNTIME_FAILURE: u8 = 1;
const BAD_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: what is wrong; the usage is one --help away.
            // clap lists missing arguments on the lines after the first; join them.
            let rendered = e.render().to_string();
            let mut lines = rendered.lines();
            let mut message = lines.next().unwrap_or("error: bad usage").to_owned();
            for item in lines.take_while(|l| !l.trim().is_empty()) {
                message.push(' ');
                message.push_str(item.trim());
            }
            eprintln!("{message} (see mirror-maker --help)");
            return ExitCode::from(BAD_USAGE);
        }
    };
    logging::init(match cli.command {
        None => cli.mirror.log_format,
        Some(_) => mirror_maker::cli::LogFormat::Text,
    });
    match cli.command {
        Some(Command::Demo(args)) => match demo::run(&args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(RUNTIME_FAILURE),
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(RUNTIME_FAILURE)
            }
        },
        Some(Command::Verify(args)) => run_verify(&args),
        Some(Command::Check(args)) => run_check(&args),
        None => run_mirror(&cli.mirror),
    }
}

fn run_check(args: &MirrorArgs) -> ExitCode {
    let settings = match Settings::from_args(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_USAGE);
        }
    };
    let report = mirror_maker::check::check(&settings);
    print!("{}", report.render());
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(RUNTIME_FAILURE)
    }
}

fn run_verify(args: &mirror_maker::cli::VerifyArgs) -> ExitCode {
    let verification = match mirror_maker::verify::Verification::from_args(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_USAGE);
        }
    };
    match mirror_maker::verify::verify(&verification) {
        Ok(report) => {
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("error: cannot write the report as JSON: {e}");
                        return ExitCode::from(RUNTIME_FAILURE);
                    }
                }
            } else {
                print!("{}", report.render());
            }
            if report.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(RUNTIME_FAILURE)
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(RUNTIME_FAILURE)
        }
    }
}

fn run_mirror(args: &MirrorArgs) -> ExitCode {
    let mut settings = match Settings::from_args(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_USAGE);
        }
    };
    let metrics_addr = match args.metrics_addr.as_deref().map(resolve_metrics_addr) {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_USAGE);
        }
        Some(Ok(addr)) => Some(addr),
        None => None,
    };
    let progress = std::time::Duration::from_millis(args.progress_interval_ms);
    if metrics_addr.is_some() || !progress.is_zero() {
        settings.enable_statistics(if progress.is_zero() {
            STATISTICS_INTERVAL
        } else {
            progress.min(STATISTICS_INTERVAL)
        });
    }
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    if let Some(addr) = metrics_addr {
        if let Err(e) = metrics::serve(addr, stats.clone(), control.clone(), settings.num_streams) {
            eprintln!(
                "error: cannot serve metrics on --metrics.addr {addr}: {e}; choose a free \
                 address or leave the flag out"
            );
            return ExitCode::from(BAD_USAGE);
        }
    }
    if !progress.is_zero() {
        metrics::log_progress(stats.clone(), control.clone(), progress);
    }
    mirror_maker::notify::start(stats.clone(), control.clone(), settings.num_streams);
    if let Err(e) = watch_signals(control.clone()) {
        eprintln!("error: cannot install signal handlers: {e:#}");
        return ExitCode::from(RUNTIME_FAILURE);
    }
    watch_shutdown(control.clone(), settings.shutdown_timeout + SHUTDOWN_GRACE);
    match pipeline::run(&settings, control, stats) {
        Ok(summary) => {
            if summary.unacknowledged > 0 {
                tracing::warn!(
                    "{} records were not acknowledged by the target before the shutdown timeout; \
                     they were not committed and will be mirrored again on restart",
                    summary.unacknowledged
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(RUNTIME_FAILURE)
        }
    }
}

/// How often the clients report statistics (lag, broker states) when metrics or progress
/// lines are on.
const STATISTICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

fn resolve_metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .map_err(|e| format!("--metrics.addr {text:?} is not a HOST:PORT address: {e}"))?
        .next()
        .ok_or_else(|| format!("--metrics.addr {text:?} resolves to no address"))
}

/// Beyond the flush timeout, how long closing the clients may take before the process exits
/// anyway (what was committed stays committed).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// The last resort against a shutdown that hangs (a client that cannot close): once a stop is
/// requested, the process exits 1 after `limit` whatever is still running.
fn watch_shutdown(control: Arc<Control>, limit: std::time::Duration) {
    let spawned = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            while !control.stop_requested() {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            std::thread::sleep(limit);
            eprintln!(
                "error: shutdown did not finish within {limit:?}; exiting without waiting further"
            );
            std::process::exit(RUNTIME_FAILURE.into());
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the shutdown watchdog: {e}");
    }
}

/// SIGINT or SIGTERM asks the streams to stop, flush and commit; a second one exits at once
/// (what was committed stays committed; the rest is mirrored again on restart).
fn watch_signals(control: Arc<Control>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let (mut int, mut term) = {
        let _guard = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                for round in 0.. {
                    let name = tokio::select! {
                        _ = int.recv() => "SIGINT",
                        _ = term.recv() => "SIGTERM",
                    };
                    if round == 0 {
                        tracing::info!("{name}: stopping (flush, commit, exit)");
                        mirror_maker::notify::stopping();
                        control.request_stop();
                    } else {
                        tracing::warn!("{name} again: exiting now without waiting for the flush");
                        std::process::exit(130);
                    }
                }
            })
        })?;
    Ok(())
}
