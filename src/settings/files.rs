//! Files named by flags (`--consumer.config`, `--producer.config`, the plugins' argument
//! files): read only when they are regular files of a config file's size, refused when their
//! group or others may write them, and warned about when others may read the secrets in them.
//!
//! A config file is code as much as data: `sasl.kerberos.kinit.cmd` is a command the client
//! runs, `plugin.library.paths` a library it loads. Whoever can write one can run code as the
//! mirror's user, so a file its group or others may write is refused.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest file a flag may name: config files and plugin arguments are small; a larger
/// file is a wrong path (a log, a data file), not a config.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A file named by a flag that cannot be used; one line naming the flag, the path and what
/// is wrong.
#[derive(Debug, thiserror::Error)]
pub struct FileError {
    /// What the file is for ("consumer config", "message handler arguments").
    pub what: &'static str,
    pub flag: &'static str,
    pub path: PathBuf,
    pub problem: Problem,
    /// Why others may not write it ([`Guard::because`]).
    pub because: &'static str,
}

/// Who besides its owner may not write a file, and why.
#[derive(Debug, Clone, Copy)]
pub struct Guard {
    /// The permission bits that refuse the file (`0o022`: group and others may write it).
    pub refused: u32,
    pub because: &'static str,
}

/// A config file or a plugin's arguments: only their owner may write them.
pub const CONFIG_IS_CODE: Guard = Guard {
    refused: 0o022,
    because: "a config file is code: `sasl.kerberos.kinit.cmd` runs a command, \
        `plugin.library.paths` loads a library",
};

/// A TLS key, certificate or CA file: refused when anyone may write it; when its group may,
/// the caller warns (a Kubernetes volume with an `fsGroup` makes its files group-writable,
/// and librdkafka, the record engine, reads them all the same).
pub const TRUST_AND_IDENTITY: Guard = Guard {
    refused: 0o002,
    because: "whoever writes it chooses which brokers the mirror trusts or whom it says it is",
};

#[derive(Debug)]
pub enum Problem {
    /// It cannot be opened or read.
    Io(std::io::Error),
    /// A directory, FIFO, device or socket (after following symlinks).
    NotAFile(&'static str),
    /// Larger than [`MAX_FILE_BYTES`].
    TooLarge(u64),
    /// Its group or others may write it (the permission bits).
    Writable(u32),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, flag, path) = (self.what, self.flag, self.path.display());
        match &self.problem {
            Problem::Io(e) => write!(f, "cannot read {what} {path} ({flag}): {e}"),
            Problem::NotAFile(kind) => write!(
                f,
                "{what} {path} ({flag}) is {kind}, not a regular file: give the path of a file"
            ),
            Problem::TooLarge(size) => write!(
                f,
                "{what} {path} ({flag}) has {size} bytes, more than the {MAX_FILE_BYTES} bytes \
                 such a file may have: is it the right file?"
            ),
            Problem::Writable(mode) => write!(
                f,
                "{what} {path} ({flag}) may be written by {} (mode {mode:04o}), and {}. Take \
                 their write permission away: chmod go-w {path}",
                if mode & 0o002 != 0 {
                    "others"
                } else {
                    "its group"
                },
                self.because
            ),
        }
    }
}

/// A file's contents and its permission bits.
#[derive(Debug)]
pub struct FileContents {
    pub bytes: Vec<u8>,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

impl FileContents {
    /// Whether its group or others may read it.
    pub fn readable_by_others(&self) -> bool {
        self.mode & 0o044 != 0
    }
}

/// Reads the file `flag` names, refusing what is not a regular file (symlinks followed), a
/// file larger than [`MAX_FILE_BYTES`], and a file its group or others may write. Nothing is
/// opened but a regular file, and opening never blocks (a FIFO swapped in between the check
/// and the open is opened without waiting, then refused).
pub fn read(
    what: &'static str,
    flag: &'static str,
    path: &Path,
) -> Result<FileContents, FileError> {
    read_guarded(what, flag, path, CONFIG_IS_CODE)
}

/// As [`read`], refusing the file by `guard`'s permission bits instead (a key or certificate
/// file named by a config key: `flag` is then that key).
pub fn read_guarded(
    what: &'static str,
    flag: &'static str,
    path: &Path,
    guard: Guard,
) -> Result<FileContents, FileError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
    let error = |problem| FileError {
        what,
        flag,
        path: path.to_owned(),
        problem,
        because: guard.because,
    };
    let check = |meta: &std::fs::Metadata| -> Result<u32, FileError> {
        let kind = meta.file_type();
        let not_a_file = if kind.is_dir() {
            Some("a directory")
        } else if kind.is_fifo() {
            Some("a FIFO (named pipe)")
        } else if kind.is_char_device() {
            Some("a character device")
        } else if kind.is_block_device() {
            Some("a block device")
        } else if kind.is_socket() {
            Some("a socket")
        } else if !kind.is_file() {
            Some("not a file")
        } else {
            None
        };
        if let Some(kind) = not_a_file {
            return Err(error(Problem::NotAFile(kind)));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(error(Problem::TooLarge(meta.len())));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & guard.refused != 0 {
            return Err(error(Problem::Writable(mode)));
        }
        Ok(mode)
    };
    check(&std::fs::metadata(path).map_err(|e| error(Problem::Io(e)))?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| error(Problem::Io(e)))?;
    // The file opened, which may not be the one checked above.
    let mode = check(&file.metadata().map_err(|e| error(Problem::Io(e)))?)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(Problem::Io(e)))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(error(Problem::TooLarge(bytes.len() as u64)));
    }
    Ok(FileContents { bytes, mode })
}

/// The warning for a file holding secrets (`holding`: what, e.g. "`sasl.password`") that its
/// group or others may read, or `None` when only its owner may.
pub fn exposure_warning(
    what: &str,
    path: &Path,
    contents: &FileContents,
    holding: &str,
) -> Option<String> {
    contents.readable_by_others().then(|| {
        let path = path.display();
        format!(
            "{what} {path} holds {holding} and may be read by its group or by others (mode \
             {:04o}): chmod 600 {path} (or chmod 640 with a group only the mirror's user is in)",
            contents.mode
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(mode: u32, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn a_private_regular_file_is_read_with_its_mode() {
        let (_dir, path) = file(0o640, b"a = 1\n");
        let contents = read("consumer config", "--consumer.config", &path).unwrap();
        assert_eq!(contents.bytes, b"a = 1\n");
        assert_eq!(contents.mode, 0o640);
        assert!(contents.readable_by_others());
    }

    #[test]
    fn a_file_of_exactly_the_limit_is_read_and_one_byte_more_is_refused() {
        let (_dir, path) = file(0o600, &vec![b'#'; MAX_FILE_BYTES as usize]);
        assert!(read("c", "--f", &path).is_ok());
        let (_dir, path) = file(0o600, &vec![b'#'; MAX_FILE_BYTES as usize + 1]);
        let err = read("consumer config", "--consumer.config", &path).unwrap_err();
        assert!(matches!(err.problem, Problem::TooLarge(n) if n == MAX_FILE_BYTES + 1));
    }

    #[test]
    fn the_warning_names_the_file_the_secret_and_the_remedy_only_when_others_may_read() {
        let (_dir, path) = file(0o600, b"");
        let private = read("c", "--f", &path).unwrap();
        assert_eq!(
            exposure_warning("c", &path, &private, "`sasl.password`"),
            None
        );
        let (_dir, path) = file(0o604, b"");
        let shared = read("producer config", "--f", &path).unwrap();
        let warning =
            exposure_warning("producer config", &path, &shared, "`sasl.password`").unwrap();
        for needle in [
            &path.display().to_string()[..],
            "`sasl.password`",
            "0604",
            "chmod 600",
            "chmod 640",
        ] {
            assert!(warning.contains(needle), "{needle}: {warning}");
        }
    }
}
