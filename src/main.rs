//! `mirror-maker`: subcommand dispatch, and the one place where an outcome becomes an exit
//! code: 0 clean shutdown (a SIGINT/SIGTERM, during the start too; or a check that found
//! nothing wrong), 1 runtime failure, 2 bad usage or configuration. (130: a second
//! SIGINT/SIGTERM, a second or more after the first, exits at once, from the signal thread.)

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use mirror_maker::mirror::pipeline;
use mirror_maker::mirror::state::{Control, Stats};
use mirror_maker::native::failpoint;
use mirror_maker::ops::{health, logging, notify, progress, signals};
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

/// clap's error as one line: what is wrong, clap's tips (the flag, value or subcommand a
/// misspelt one is near); the usage is one --help away (the subcommand's own, for a
/// subcommand). clap lists missing arguments on the lines after the first; they are joined.
fn one_line_usage_error(e: &clap::Error, subcommand: Option<&str>) -> String {
    let rendered = e.render().to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("error: bad usage");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    for item in lines.by_ref().take_while(|l| !l.trim().is_empty()) {
        message.push(' ');
        message.push_str(item.trim());
    }
    for tip in lines.map(str::trim).filter(|l| l.starts_with("tip: ")) {
        message.push_str("; ");
        message.push_str(tip);
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
    let report = match verify::verify(&verification) {
        Ok(report) => report,
        Err(e) => {
            if args.json {
                // The report's place on stdout holds the error, so that what reads it reads
                // JSON whatever happened; the error line goes to stderr as ever.
                let error = serde_json::json!({ "ok": false, "error": format!("{e:#}") });
                println!("{error:#}");
            }
            return Err(Failure::Runtime(e));
        }
    };
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
    let metrics_addr = settings.metrics_addr;
    let progress_interval = Duration::from_millis(args.progress_interval_ms);
    if metrics_addr.is_some()
        || !progress_interval.is_zero()
        || args.max_replication_delay_ms.is_some()
    {
        settings.enable_statistics(if progress_interval.is_zero() {
            STATISTICS_INTERVAL
        } else {
            progress_interval.min(STATISTICS_INTERVAL)
        });
    }
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    let max_delay = args.max_replication_delay_ms.map(Duration::from_millis);
    if let (Some(addr), Some(text)) = (metrics_addr, args.metrics_addr.as_deref()) {
        let allowed = health::allowed_hosts(text, &args.metrics_allowed_hosts);
        health::serve(
            addr,
            allowed,
            stats.clone(),
            control.clone(),
            settings.options.num_streams,
            max_delay,
        )
        .map_err(|e| {
            usage(format!(
                "cannot serve metrics on --metrics.addr {addr}: {e}; choose a free address \
                     or leave the flag out"
            ))
        })?;
    }
    if !progress_interval.is_zero() {
        progress::log_progress(stats.clone(), control.clone(), progress_interval);
    }
    notify::start(
        stats.clone(),
        control.clone(),
        settings.options.num_streams,
        max_delay,
    );
    signals::watch(control.clone()).map_err(|e| {
        Failure::Runtime(anyhow::Error::new(e).context("cannot install signal handlers"))
    })?;
    signals::watch_shutdown(
        control.clone(),
        settings.options.shutdown_timeout + signals::SHUTDOWN_GRACE,
        args.log_format,
        RUNTIME_FAILURE,
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
