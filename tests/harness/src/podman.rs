//! Podman and the local Debian base for the image and package tests (tests/container.rs,
//! tests/deb.rs): `scripts/base-image` makes both the podman base image and the root
//! filesystem tarball, once, without a registry.
//!
//! Podman runs with a containers.conf of the harness's own (`CONTAINERS_CONF`): runc, since
//! crun 1.8 (Debian 12's) refuses hosts whose cgroups are mounted in hybrid mode ("cgroups in
//! hybrid mode not supported"), and default ulimits no higher than this process's, since
//! podman otherwise raises RLIMIT_NOFILE and RLIMIT_NPROC, which fails without
//! CAP_SYS_RESOURCE ("setrlimit `RLIMIT_NOFILE`: Operation not permitted").

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::{target_dir, workspace_root};

fn require(command: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(command).is_file()));
    assert!(
        found,
        "{command} is not installed: install the Debian package {package} \
         (./scripts/test installs it when absent)"
    );
}

/// This process's soft limit named `name` in /proc/self/limits ("Max open files"), at most
/// `cap`.
fn limit(name: &str, cap: u64) -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse::<u64>().ok())
        .map_or(cap, |soft| soft.min(cap))
}

/// The harness's containers.conf (for a podman run through a shell).
pub fn containers_conf() -> &'static Path {
    static CONF: OnceLock<PathBuf> = OnceLock::new();
    CONF.get_or_init(|| {
        require("podman", "podman");
        require("runc", "runc");
        let nofile = limit("Max open files", 65536);
        // Even this process's own RLIMIT_NPROC is refused on some hosts; 4096 is plenty.
        let nproc = limit("Max processes", 4096);
        let path = target_dir().join(format!("podman-containers-{nofile}-{nproc}.conf"));
        std::fs::create_dir_all(target_dir()).expect("creating the target directory");
        std::fs::write(
            &path,
            format!(
                "[containers]\n\
                 default_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\
                 [engine]\n\
                 runtime = \"runc\"\n"
            ),
        )
        .expect("writing the harness's containers.conf");
        path
    })
}

/// `podman` with the harness's containers.conf; panics with what to install when podman or
/// runc is absent.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", containers_conf());
    cmd
}

/// Held while a test builds or removes an image: podman's build looks through the images of
/// earlier builds for a cached layer, and fails ("checking if cached image exists from a
/// previous build: ... layer not known") when another build's image is removed meanwhile.
pub fn one_build_at_a_time() -> MutexGuard<'static, ()> {
    static BUILDS: Mutex<()> = Mutex::new(());
    BUILDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `cmd`, panics with its stderr unless it succeeds; returns its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd` and returns its trimmed stdout (panics unless it succeeds).
pub fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run_ok(cmd).stdout)
        .trim()
        .to_owned()
}

fn base_image_script(args: &[&str]) -> String {
    let out = stdout_of(
        Command::new(workspace_root().join("scripts/base-image"))
            .args(args)
            .env("CONTAINERS_CONF", containers_conf()),
    );
    out.lines().last().unwrap_or_default().to_owned()
}

/// The tag of the local bookworm base image (`scripts/base-image`: debootstrap minbase with
/// ca-certificates, cached in $HOME/.cache/mirror-maker).
pub fn base_image() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| base_image_script(&[]))
}

/// The tarball of the same root filesystem (`scripts/base-image --tarball`).
pub fn base_rootfs() -> &'static Path {
    static TARBALL: OnceLock<PathBuf> = OnceLock::new();
    TARBALL.get_or_init(|| {
        require("debootstrap", "debootstrap");
        PathBuf::from(base_image_script(&["--tarball"]))
    })
}
