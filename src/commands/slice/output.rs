//! Writing `ipsetmgr slice -o PATH`: the one place the CLI writes a path.
//!
//! What PATH is decides how (docs/kubectl-get.md, "Member slices"):
//! - a character device, FIFO or socket (`/dev/null`, `/dev/stdout` of a
//!   pipe, a named pipe read by another process) is opened and written as it
//!   is: replacing it by a rename would turn `/dev/null` into a regular
//!   file, and truncating it means nothing there;
//! - a symlink is followed, and its target written by these same rules (the
//!   link stays a link);
//! - a regular file, or a path that does not exist yet, is written through
//!   a temporary file in the target's directory, renamed into place once
//!   complete, so a failed run never leaves half a list of slices for a
//!   later `kubectl apply`. The new file gets the old one's mode and owner;
//!   where the owner cannot be kept (not root, someone else's file), the
//!   file is rewritten in place instead: what was there never changes
//!   owner or mode.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How many symlinks a path may pass through (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Write what `print` prints to `path`, by the rules above.
pub(crate) fn write_output(
    path: &Path,
    print: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "a directory; name a file",
        )),
        Ok(meta) if meta.is_file() => {
            // The kernel resolves `/proc/self/fd/1` and other magic links
            // too; the temporary file must sit beside the real file.
            let target = fs::canonicalize(path)?;
            replace_file(&target, &meta, print)
        }
        // Devices, FIFOs, sockets: the path itself, the kernel following
        // any links.
        Ok(_) => write_in_place(path, print),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_file(&dangling_target(path)?, print)
        }
        Err(e) => Err(e),
    }
}

/// A path that does not exist, or a symlink (chain) to one: the path the
/// new file is made at.
fn dangling_target(path: &Path) -> io::Result<PathBuf> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = fs::read_link(&at)?;
                at = match at.parent() {
                    Some(dir) => dir.join(link),
                    None => link,
                };
            }
            Ok(_) => return Ok(at),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(at),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "more than {MAX_LINKS} symlinks to follow"
    )))
}

/// Open without creating or truncating, and write.
fn write_in_place(
    path: &Path,
    print: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    let mut w = BufWriter::new(file);
    print(&mut w)?;
    w.flush()
}

/// An existing regular file: atomically, keeping its mode and owner; in
/// place where its owner cannot be given to a new file.
fn replace_file(
    path: &Path,
    old: &fs::Metadata,
    print: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let temp = temp_path(path)?;
    let file = create_temp(&temp)?;
    let kept = keep_owner(&file, old).and_then(|()| {
        // After the chown, which clears set-id bits.
        file.set_permissions(fs::Permissions::from_mode(old.mode() & 0o7777))
    });
    if let Err(e) = kept {
        drop(file);
        let _ = fs::remove_file(&temp);
        if e.kind() != io::ErrorKind::PermissionDenied {
            return Err(e);
        }
        let file = OpenOptions::new().write(true).truncate(true).open(path)?;
        let mut w = BufWriter::new(file);
        print(&mut w)?;
        return w.flush();
    }
    finish(file, &temp, path, print)
}

/// A new file, atomically (its mode from the umask, as any new file's).
fn create_file(
    path: &Path,
    print: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let temp = temp_path(path)?;
    let file = create_temp(&temp)?;
    finish(file, &temp, path, print)
}

/// Print into the temporary file, sync it and rename it over `path`; the
/// temporary file is removed when anything fails.
fn finish(
    file: File,
    temp: &Path,
    path: &Path,
    print: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let written = (|| {
        let mut w = BufWriter::new(file);
        print(&mut w)?;
        w.into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .sync_all()?;
        fs::rename(temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(temp);
    }
    written
}

fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp-{}", std::process::id()));
    Ok(path.with_file_name(temp))
}

fn create_temp(temp: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(temp)
}

/// Give `file` the owner of `old`, where it differs (needs root, or the
/// group change of a member of both groups).
fn keep_owner(file: &File, old: &fs::Metadata) -> io::Result<()> {
    let new = file.metadata()?;
    if (new.uid(), new.gid()) == (old.uid(), old.gid()) {
        return Ok(());
    }
    std::os::unix::fs::fchown(file, Some(old.uid()), Some(old.gid()))
}
