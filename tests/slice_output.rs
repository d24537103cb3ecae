//! `ipsetmgr slice -o PATH` writes into what PATH is (issue 36): a FIFO or
//! a character device is written in place and stays what it was, a symlink
//! is followed and stays a link, a regular file is replaced atomically with
//! its mode and owner kept, a new path is created. The binary is run as a
//! user runs it. Every path is in a temporary directory: the device case
//! makes its own node with mknod (the null device's numbers, 1:3), never
//! the real /dev/null.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use ipsetmgr_api::IPSetMemberSlice;

#[path = "common/cli.rs"]
mod cli;
use cli::{ipsetmgr, text};

/// A small member list in `dir`.
fn list(dir: &Path) -> String {
    let path = dir.join("list.txt");
    std::fs::write(&path, "10.0.0.1\n10.0.0.2\n10.0.0.3\n").unwrap();
    path.to_str().unwrap().to_string()
}

/// `ipsetmgr slice -o out`, which must succeed.
fn slice_to(list: &str, out: &Path) {
    let o = ipsetmgr(
        &[
            "slice",
            "--policy",
            "b",
            "-f",
            list,
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// The members of the slices in `yaml`.
fn members(yaml: &str) -> Vec<String> {
    let slices: Vec<IPSetMemberSlice> =
        serde_saphyr::from_multiple(yaml).expect("a YAML stream of slices");
    let mut m: Vec<String> = slices.into_iter().flat_map(|s| s.spec.members).collect();
    m.sort();
    m
}

fn want() -> Vec<String> {
    ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        .map(String::from)
        .to_vec()
}

/// Names in `dir` other than `keep`: a temporary file left behind.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

#[test]
fn a_fifo_is_written_in_place_and_read_by_its_reader() {
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    let fifo = d.path().join("out.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader_path = fifo.clone();
    // Blocks in open until a writer opens the FIFO: if the command renames
    // a file over it instead, nobody ever does, and the check of the file
    // type below fails first.
    std::thread::spawn(move || {
        let mut s = String::new();
        std::fs::File::open(&reader_path)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        let _ = tx.send(s);
    });
    slice_to(&list, &fifo);
    let meta = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(
        meta.file_type().is_fifo(),
        "the FIFO was replaced: now {:?}",
        meta.file_type()
    );
    let read = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the reader got the slices");
    assert_eq!(members(&read), want());
    assert_eq!(leftovers(d.path(), &["list.txt", "out.fifo"]), [""; 0]);
}

#[test]
fn a_character_device_stays_a_character_device_with_its_mode() {
    const TEST: &str = "a_character_device_stays_a_character_device_with_its_mode";
    if !nix::unistd::geteuid().is_root() {
        ipsetmgr_envtest::cannot_run(TEST, &"needs root (mknod of a device node)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    // A null device of our own, with a mode /dev/null never has.
    let dev = d.path().join("null");
    nix::sys::stat::mknod(
        &dev,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o620),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o620)).unwrap();
    let before = std::fs::symlink_metadata(&dev).unwrap();
    slice_to(&list, &dev);
    let after = std::fs::symlink_metadata(&dev).unwrap();
    assert!(
        after.file_type().is_char_device(),
        "the device was replaced: now {:?}, {} bytes",
        after.file_type(),
        after.len()
    );
    assert_eq!(
        (
            after.rdev(),
            after.mode(),
            after.uid(),
            after.gid(),
            after.ino()
        ),
        (
            before.rdev(),
            before.mode(),
            before.uid(),
            before.gid(),
            before.ino()
        ),
        "device numbers, mode, owner and inode unchanged"
    );
    assert_eq!(leftovers(d.path(), &["list.txt", "null"]), [""; 0]);
}

#[test]
fn a_symlink_stays_a_link_and_its_target_gets_the_slices() {
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    let (links, volume) = (d.path().join("links"), d.path().join("volume"));
    std::fs::create_dir(&links).unwrap();
    std::fs::create_dir(&volume).unwrap();
    let target = volume.join("slices.yaml");
    std::fs::write(&target, "old\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = links.join("slices.yaml");
    std::os::unix::fs::symlink("../volume/slices.yaml", &link).unwrap();
    slice_to(&list, &link);
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(
        meta.file_type().is_symlink(),
        "the link was replaced: now {:?}",
        meta.file_type()
    );
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("../volume/slices.yaml")
    );
    assert_eq!(members(&std::fs::read_to_string(&target).unwrap()), want());
    let mode = std::fs::metadata(&target).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o640, "the target's mode is kept: {mode:o}");
    assert_eq!(leftovers(&links, &["slices.yaml"]), [""; 0]);
    assert_eq!(leftovers(&volume, &["slices.yaml"]), [""; 0]);

    // A link to a file that does not exist yet: the file is made there.
    let dangling = links.join("new.yaml");
    std::os::unix::fs::symlink("../volume/new.yaml", &dangling).unwrap();
    slice_to(&list, &dangling);
    assert!(
        std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let made = std::fs::read_to_string(volume.join("new.yaml")).unwrap();
    assert_eq!(members(&made), want());
}

#[test]
fn a_regular_file_is_replaced_keeping_its_mode_and_owner() {
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    let out = d.path().join("slices.yaml");
    std::fs::write(&out, "old\n").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    // Another owner, where the test may give it one (root).
    let root = nix::unistd::geteuid().is_root();
    if root {
        std::os::unix::fs::chown(&out, Some(4321), Some(4321)).unwrap();
    }
    let before = std::fs::metadata(&out).unwrap();
    slice_to(&list, &out);
    let after = std::fs::metadata(&out).unwrap();
    assert!(after.is_file());
    assert_eq!(members(&std::fs::read_to_string(&out).unwrap()), want());
    assert_eq!(
        (after.mode() & 0o7777, after.uid(), after.gid()),
        (0o640, before.uid(), before.gid()),
        "mode {:o} and owner kept",
        after.mode() & 0o7777
    );
    if root {
        // Replaced by a rename, not rewritten in place: a reader of the
        // old file never sees half a list.
        assert_ne!(after.ino(), before.ino(), "replaced atomically");
    }
    assert_eq!(leftovers(d.path(), &["list.txt", "slices.yaml"]), [""; 0]);
}

#[test]
fn a_new_path_is_created() {
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    let out = d.path().join("new.yaml");
    slice_to(&list, &out);
    assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
    assert_eq!(members(&std::fs::read_to_string(&out).unwrap()), want());
    assert_eq!(leftovers(d.path(), &["list.txt", "new.yaml"]), [""; 0]);
}

#[test]
fn a_directory_is_refused_and_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let list = list(d.path());
    let dir = d.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let o = ipsetmgr(
        &[
            "slice",
            "--policy",
            "b",
            "-f",
            &list,
            "-o",
            dir.to_str().unwrap(),
        ],
        None,
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o.stderr).contains("out"), "{}", text(&o.stderr));
    assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!(leftovers(d.path(), &["list.txt", "out"]), [""; 0]);
}
