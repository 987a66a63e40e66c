//! `mirror-maker`: subcommand dispatch, and the one place where an outcome becomes an exit
//! code: 0 clean shutdown (or a check that found nothing wrong), 1 runtime failure, 2 bad
//! usage or configuration. (130: a second SIGINT/SIGTERM, a second or more after the first,
//! exits at once, from the signal thread.)

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use mirror_maker::mirror::pipeline;
use mirror_maker::mirror::state::{Control, Stats};
use mirror_maker::native::failpoint;
use mirror_maker::ops::{health, logging, notify, progress};
use mirror_maker::settings::flags::{
    Cli, Command, LogFormat, MirrorArgs, TranslateArgs, VerifyArgs,
};
use mirror_maker::settings::Settings;
use mirror_maker::tools::{check, demo, translate, verify};

/// How a run ended, when it ended without an error of its own.
enum Outcome {
    /// Exit 0.
    Success,
    /// Exit 1 after the command reported what it found (a failed check, verify or demo).
    Failed,
}

/// An error that ends the process, printed once by `main`.
enum Failure {
    /// Bad usage or configuration: exit 2, before any broker is contacted.
    Usage(anyhow::Error),
    /// Exit 1.
    Runtime(anyhow::Error),
}

const RUNTIME_FAILURE: u8 = 1;
const BAD_USAGE: u8 = 2;

fn main() -> ExitCode {
    // Before the command line is parsed: its errors are printed in the format asked for.
    let format = LogFormat::requested(std::env::args_os());
    logging::init(format);
    match run() {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(RUNTIME_FAILURE),
        Err(Failure::Usage(e)) => {
            logging::final_error(format, &format!("{e:#}"));
            ExitCode::from(BAD_USAGE)
        }
        Err(Failure::Runtime(e)) => {
            logging::final_error(format, &format!("{e:#}"));
            ExitCode::from(RUNTIME_FAILURE)
        }
    }
}

fn run() -> Result<Outcome, Failure> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return Ok(Outcome::Success);
        }
        Err(e) => {
            let subcommand = subcommand_named(std::env::args().nth(1).as_deref());
            return Err(usage(one_line_usage_error(&e, subcommand.as_deref())));
        }
    };
    match cli.command {
        Some(Command::Demo(args)) => match demo::run(&args).map_err(Failure::Runtime)? {
            true => Ok(Outcome::Success),
            false => Ok(Outcome::Failed),
        },
        Some(Command::Verify(args)) => run_verify(&args),
        Some(Command::Check(args)) => run_check(&args),
        Some(Command::Translate(args)) => run_translate(&args),
        None => run_mirror(&cli.mirror),
    }
}

/// `arg` if it names a subcommand (`verify`, `check`, `demo`).
fn subcommand_named(arg: Option<&str>) -> Option<String> {
    use clap::CommandFactory;
    let arg = arg?;
    Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == arg)
        .then(|| arg.to_owned())
}

/// clap's error as one line: what is wrong; the usage is one --help away (the subcommand's
/// own, for a subcommand). clap lists missing arguments on the lines after the first; they
/// are joined.
fn one_line_usage_error(e: &clap::Error, subcommand: Option<&str>) -> String {
    let rendered = e.render().to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("error: bad usage");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    for item in lines.take_while(|l| !l.trim().is_empty()) {
        message.push(' ');
        message.push_str(item.trim());
    }
    match subcommand {
        Some(name) => message.push_str(&format!(" (see mirror-maker {name} --help)")),
        None => message.push_str(" (see mirror-maker --help)"),
    }
    message
}

/// A typed error whose message already names its cause (so its chain is not printed again).
fn usage(e: impl std::fmt::Display) -> Failure {
    Failure::Usage(anyhow::Error::msg(e.to_string()))
}

/// As [`usage`], for exit 1.
fn runtime(e: impl std::fmt::Display) -> Failure {
    Failure::Runtime(anyhow::Error::msg(e.to_string()))
}

fn run_check(args: &MirrorArgs) -> Result<Outcome, Failure> {
    let settings = Settings::from_args(args).map_err(usage)?;
    let report = check::check(&settings);
    print!("{}", report.render());
    Ok(if report.problems.is_empty() {
        Outcome::Success
    } else {
        Outcome::Failed
    })
}

fn run_verify(args: &VerifyArgs) -> Result<Outcome, Failure> {
    let verification = verify::Verification::from_args(args).map_err(usage)?;
    let report = verify::verify(&verification).map_err(Failure::Runtime)?;
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| runtime(format!("cannot write the report as JSON: {e}")))?;
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(if report.ok {
        Outcome::Success
    } else {
        Outcome::Failed
    })
}

fn run_translate(args: &TranslateArgs) -> Result<Outcome, Failure> {
    let translate = translate::Translate::from_args(args).map_err(usage)?;
    let report = translate.run().map_err(runtime)?;
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| runtime(format!("cannot write the result as JSON: {e}")))?;
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(if report.ok() {
        Outcome::Success
    } else {
        Outcome::Failed
    })
}

fn run_mirror(args: &MirrorArgs) -> Result<Outcome, Failure> {
    let mut settings = Settings::from_args(args).map_err(usage)?;
    failpoint::check().map_err(usage)?;
    let metrics_addr = args
        .metrics_addr
        .as_deref()
        .map(resolve_metrics_addr)
        .transpose()
        .map_err(usage)?;
    let progress_interval = Duration::from_millis(args.progress_interval_ms);
    if metrics_addr.is_some() || !progress_interval.is_zero() {
        settings.enable_statistics(if progress_interval.is_zero() {
            STATISTICS_INTERVAL
        } else {
            progress_interval.min(STATISTICS_INTERVAL)
        });
    }
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    if let Some(addr) = metrics_addr {
        health::serve(addr, stats.clone(), control.clone(), settings.num_streams).map_err(|e| {
            usage(format!(
                "cannot serve metrics on --metrics.addr {addr}: {e}; choose a free address \
                     or leave the flag out"
            ))
        })?;
    }
    if !progress_interval.is_zero() {
        progress::log_progress(stats.clone(), control.clone(), progress_interval);
    }
    notify::start(stats.clone(), control.clone(), settings.num_streams);
    watch_signals(control.clone())
        .map_err(|e| Failure::Runtime(e.context("cannot install signal handlers")))?;
    watch_shutdown(
        control.clone(),
        settings.shutdown_timeout + SHUTDOWN_GRACE,
        args.log_format,
    );
    let summary = pipeline::run(&settings, control, stats).map_err(runtime)?;
    if summary.unacknowledged > 0 {
        tracing::warn!(
            "{} not acknowledged by the target before the shutdown timeout: not committed, \
             mirrored again on restart",
            mirror_maker::settings::counted(summary.unacknowledged, "record")
        );
    }
    Ok(Outcome::Success)
}

/// How often the clients report statistics (lag, broker states) when metrics or progress
/// lines are on.
const STATISTICS_INTERVAL: Duration = Duration::from_secs(5);

fn resolve_metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .map_err(|e| format!("--metrics.addr {text:?} is not a HOST:PORT address: {e}"))?
        .next()
        .ok_or_else(|| format!("--metrics.addr {text:?} resolves to no address"))
}

/// Beyond the flush timeout, how long closing the clients may take before the process exits
/// anyway (what was committed stays committed).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The last resort against a shutdown that hangs (a client that cannot close): once a stop is
/// requested, the process exits 1 after `limit` whatever is still running.
fn watch_shutdown(control: Arc<Control>, limit: Duration, format: LogFormat) {
    let spawned = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            while !control.stop_requested() {
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(limit);
            logging::final_error(
                format,
                &format!(
                    "shutdown did not finish within {limit:?}; exiting without waiting further"
                ),
            );
            std::process::exit(RUNTIME_FAILURE.into());
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the shutdown watchdog: {e}");
    }
}

/// How long after the first signal another one is still the same request: supervisors signal
/// the process and its group microseconds apart (GNU `timeout`, systemd's
/// KillMode=control-group, `docker stop` of a shell's children), a person presses Ctrl-C again.
const SAME_REQUEST: Duration = Duration::from_secs(1);

/// Exit code when a second signal ends the process without waiting for the flush.
const EXIT_NOW: i32 = 130;

/// SIGINT or SIGTERM asks the streams to stop, flush and commit; another one at least
/// [`SAME_REQUEST`] later exits at once with 130 (what was committed stays committed; the rest
/// is mirrored again on restart).
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
                let mut first: Option<std::time::Instant> = None;
                loop {
                    let name = tokio::select! {
                        _ = int.recv() => "SIGINT",
                        _ = term.recv() => "SIGTERM",
                    };
                    match first {
                        None => {
                            first = Some(std::time::Instant::now());
                            tracing::info!("{name}: stopping (flush, commit, exit)");
                            notify::stopping();
                            control.request_stop();
                        }
                        Some(at) if at.elapsed() < SAME_REQUEST => tracing::debug!(
                            "{name} again within {SAME_REQUEST:?} of the first: the same stop \
                             request"
                        ),
                        Some(_) => {
                            tracing::warn!(
                                "{name} again: exiting now without waiting for the flush \
                                 (exit {EXIT_NOW})"
                            );
                            std::process::exit(EXIT_NOW);
                        }
                    }
                }
            })
        })?;
    Ok(())
}
