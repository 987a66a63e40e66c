//! The Debian package (scripts/deb, dpkg-deb from a staged tree), built from the binary cargo
//! built for this test: its files and fields as read by dpkg-deb, then installed with dpkg into
//! a throwaway copy of scripts/base-image's bookworm root filesystem and run there in a chroot.
//!
//! Needs root (chroot; debootstrap the first time) and debootstrap (./scripts/test installs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use mirror_test_harness::podman::{base_rootfs, run_ok, stdout_of};
use mirror_test_harness::*;

/// The .deb, built once per test process; the folder holding it lives as long as the process.
fn deb() -> &'static Path {
    static DEB: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, deb) = DEB.get_or_init(|| build_deb(None));
    deb
}

/// Runs scripts/deb on the test's binary (with this unit instead of the repository's).
fn build_deb(unit: Option<&Path>) -> (tempfile::TempDir, PathBuf) {
    let started = std::time::Instant::now();
    let out = tempdir();
    let mut cmd = Command::new(workspace_root().join("scripts/deb"));
    cmd.arg(env!("CARGO_BIN_EXE_mirror-maker")).arg(out.path());
    if let Some(unit) = unit {
        cmd.env("MIRROR_UNIT", unit);
    }
    let deb = stdout_of(&mut cmd);
    eprintln!(
        "DEB {deb}: {} bytes, built in {:.1} s",
        std::fs::metadata(&deb).unwrap().len(),
        started.elapsed().as_secs_f64()
    );
    (out, PathBuf::from(deb))
}

/// A throwaway copy of scripts/base-image's bookworm root filesystem.
fn bare_bookworm() -> tempfile::TempDir {
    assert!(
        stdout_of(Command::new("id").arg("-u")) == "0",
        "installing into a chroot needs root"
    );
    let rootfs = tempdir();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(rootfs.path())
            .arg("-xf")
            .arg(base_rootfs()),
    );
    rootfs
}

/// Runs `args` in the chroot `root`; its stdout.
fn chroot(root: &Path, args: &[&str]) -> String {
    stdout_of(
        Command::new("chroot")
            .arg(root)
            .args(args)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
    )
}

fn dpkg_deb(args: &[&str]) -> String {
    stdout_of(Command::new("dpkg-deb").args(args).arg(deb()))
}

/// The `Field: value` of a control file's text.
fn field(control: &str, name: &str) -> String {
    control
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{control}"))
        .to_owned()
}

#[test]
fn the_deb_holds_the_binary_the_unit_and_the_example_configs_as_conffiles() {
    let listing = dpkg_deb(&["--contents"]);
    // path -> (mode, owner) from `dpkg-deb -c` lines: "-rwxr-xr-x root/root 123 date time ./path"
    let entry = |path: &str| -> (String, String) {
        listing
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.last() == Some(&format!(".{path}").as_str()))
            .map(|f| (f[0].to_owned(), f[1].to_owned()))
            .unwrap_or_else(|| panic!("{path} not in the package:\n{listing}"))
    };
    let root = "root/root".to_owned();
    assert_eq!(
        entry("/usr/bin/mirror-maker"),
        ("-rwxr-xr-x".into(), root.clone())
    );
    for file in [
        "/lib/systemd/system/mirror-maker.service",
        "/etc/mirror-maker/consumer.toml",
        "/etc/mirror-maker/producer.toml",
        "/etc/mirror-maker/sasl-ssl/consumer.toml",
        "/usr/share/doc/mirror-maker/copyright",
    ] {
        assert_eq!(entry(file), ("-rw-r--r--".into(), root.clone()), "{file}");
    }
    assert!(!listing.contains("/usr/local/"), "{listing}");

    // Every example config is a conffile: an upgrade keeps the user's edits.
    let conffiles = stdout_of(
        Command::new("dpkg-deb")
            .arg("--info")
            .arg(deb())
            .arg("conffiles"),
    );
    let etc: Vec<&str> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last()?.strip_prefix('.'))
        .filter(|p| p.starts_with("/etc/"))
        .collect();
    assert!(etc.len() >= 9, "{etc:?}");
    assert_eq!(conffiles.lines().collect::<Vec<_>>(), etc);

    // The unit is the repository's, hardening and all, run from /usr/bin.
    let unit = stdout_of(
        Command::new("sh")
            .arg("-c")
            .arg("dpkg-deb --fsys-tarfile \"$0\" | tar -xO ./lib/systemd/system/mirror-maker.service")
            .arg(deb()),
    );
    let expected = std::fs::read_to_string(workspace_root().join("config/mirror-maker.service"))
        .unwrap()
        .replace("/usr/local/bin/mirror-maker", "/usr/bin/mirror-maker");
    assert_eq!(unit, expected.trim());
    assert!(unit.contains("ExecStart=/usr/bin/mirror-maker"));
}

#[test]
fn the_debs_fields_name_the_crate_version_this_architecture_and_every_linked_library() {
    let control = dpkg_deb(&["--field"]);
    assert_eq!(field(&control, "Package"), "mirror-maker");
    assert_eq!(field(&control, "Version"), env!("CARGO_PKG_VERSION"));
    let arch = stdout_of(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(field(&control, "Architecture"), arch);
    // Each shared library the binary needs comes from a package in Depends (the host's
    // package that holds the library, as dpkg knows it).
    let depends = field(&control, "Depends");
    let depended: Vec<&str> = depends
        .split(',')
        .map(|d| d.split_whitespace().next().unwrap())
        .collect();
    let ldd = stdout_of(Command::new("ldd").arg(env!("CARGO_BIN_EXE_mirror-maker")));
    let libraries: Vec<&str> = ldd
        .lines()
        .filter_map(|l| l.split("=> ").nth(1)?.split_whitespace().next())
        .collect();
    assert!(libraries.len() >= 3, "{ldd}");
    for library in libraries {
        let real = std::fs::canonicalize(library).unwrap();
        let owner = Command::new("dpkg")
            .arg("-S")
            .arg(library)
            .output()
            .unwrap();
        let owner = if owner.status.success() {
            owner
        } else {
            // /lib is a link to /usr/lib on merged-/usr systems: dpkg knows one of the two.
            run_ok(Command::new("dpkg").arg("-S").arg(&real))
        };
        let owner = String::from_utf8_lossy(&owner.stdout);
        let package = owner.split(':').next().unwrap().trim();
        assert!(
            depended.contains(&package),
            "{library} is in {package}, not in Depends: {depends}"
        );
    }
}

#[test]
fn the_deb_installs_with_dpkg_into_a_bare_bookworm_and_its_binary_runs_there() {
    let rootfs = bare_bookworm();
    let root = rootfs.path();
    std::fs::copy(deb(), root.join("tmp/mirror-maker.deb")).unwrap();
    let chroot = |args: &[&str]| chroot(root, args);
    // dpkg of the bare system itself: its Depends are checked against what bookworm's
    // minbase has, and the maintainer scripts run there.
    chroot(&["dpkg", "--install", "/tmp/mirror-maker.deb"]);
    let status = chroot(&[
        "dpkg-query",
        "--show",
        "--showformat",
        "${Status} ${Version}",
        "mirror-maker",
    ]);
    assert_eq!(
        status,
        format!("install ok installed {}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        chroot(&["mirror-maker", "--version"]),
        format!("mirror-maker {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(root.join("etc/mirror-maker/consumer.toml").is_file());
    // A purge takes everything away again, the conffiles included.
    chroot(&["dpkg", "--purge", "mirror-maker"]);
    assert!(!root.join("usr/bin/mirror-maker").exists());
    assert!(!root.join("etc/mirror-maker").exists());
}

/// The repository's unit runs with DynamicUser=yes (no user to make); should it name a
/// `User=` instead, the package's postinst makes that system user.
#[test]
fn a_unit_with_a_user_gets_that_system_user_from_the_postinst() {
    let unit = std::fs::read_to_string(workspace_root().join("config/mirror-maker.service"))
        .unwrap()
        .replace("DynamicUser=yes\n", "")
        .replace("[Service]\n", "[Service]\nUser=mirror-maker\n");
    let dir = tempdir();
    let unit_path = dir.path().join("mirror-maker.service");
    std::fs::write(&unit_path, unit).unwrap();
    let (_out, deb) = build_deb(Some(&unit_path));
    let rootfs = bare_bookworm();
    let root = rootfs.path();
    std::fs::copy(&deb, root.join("tmp/mirror-maker.deb")).unwrap();
    chroot(root, &["dpkg", "--install", "/tmp/mirror-maker.deb"]);
    let user = chroot(root, &["getent", "passwd", "mirror-maker"]);
    let fields: Vec<&str> = user.split(':').collect();
    let uid: u32 = fields[2].parse().unwrap();
    assert!(uid < 1000, "not a system user: {user}");
    assert_eq!(fields[6], "/usr/sbin/nologin", "{user}");
    // Reinstalling finds the user there and leaves it.
    chroot(root, &["dpkg", "--install", "/tmp/mirror-maker.deb"]);
    assert_eq!(chroot(root, &["getent", "passwd", "mirror-maker"]), user);
}
