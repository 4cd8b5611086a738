//! The store's contract: verified, crash-safe, concurrent puts; references; collection.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use gpusnap_node_store::{BlobId, Holder, RefRecord, Slot, Store, StoreError};
use sha2::{Digest as _, Sha256};

fn id_of(bytes: &[u8]) -> BlobId {
    let h = Sha256::digest(bytes);
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    BlobId::parse(&format!("sha256:{hex}")).unwrap()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn read_blob(store: &Store, id: &BlobId) -> Vec<u8> {
    let mut out = Vec::new();
    store
        .open_blob(id)
        .unwrap()
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn set_last_used(store: &Store, id: &BlobId, secs_ago: u64) {
    let f = std::fs::File::open(store.root().join("blobs").join(id.hex())).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
        .unwrap();
}

#[test]
fn put_verifies_size_and_digest_and_keeps_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    let lease = store.lease().unwrap();
    let data = b"hello, blob".to_vec();
    let id = id_of(&data);

    // Short, long and wrong bytes are refused, and nothing is visible or left behind.
    let err = store.put(&lease, &id, 100, &data[..]).unwrap_err();
    assert!(matches!(err, StoreError::SizeMismatch { .. }), "{err}");
    let err = store.put(&lease, &id, 3, &data[..]).unwrap_err();
    assert!(matches!(err, StoreError::SizeMismatch { .. }), "{err}");
    let mut wrong = data.clone();
    wrong[0] ^= 1;
    let err = store
        .put(&lease, &id, data.len() as u64, &wrong[..])
        .unwrap_err();
    assert!(matches!(err, StoreError::DigestMismatch { .. }), "{err}");
    assert!(!store.has(&id).unwrap());
    assert!(entries(&root.join("tmp")).is_empty());
    assert!(entries(&root.join("blobs")).is_empty());

    assert!(store
        .put(&lease, &id, data.len() as u64, &data[..])
        .unwrap());
    assert!(!store
        .put(&lease, &id, data.len() as u64, &data[..])
        .unwrap());
    assert_eq!(store.len(&id).unwrap(), Some(data.len() as u64));
    assert_eq!(read_blob(&store, &id), data);
    let mode = std::fs::metadata(root.join("blobs").join(id.hex()))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o400);
}

#[test]
fn concurrent_puts_of_one_blob_from_threads_write_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("s")).unwrap());
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let data = Arc::new(data);
    let id = id_of(&data);
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (store, data, id, barrier) =
                (store.clone(), data.clone(), id.clone(), barrier.clone());
            std::thread::spawn(move || {
                let lease = store.lease().unwrap();
                barrier.wait();
                store
                    .put(&lease, &id, data.len() as u64, &data[..])
                    .unwrap()
            })
        })
        .collect();
    let wrote: usize = handles
        .into_iter()
        .map(|h| usize::from(h.join().unwrap()))
        .sum();
    assert_eq!(wrote, 1, "the blob was written {wrote} times");
    assert_eq!(read_blob(&store, &id), *data);
    assert!(entries(&store.root().join("tmp")).is_empty());
}

/// Child side of the multi-process tests (does nothing unless the parent set it up).
#[test]
fn child_process_writer() {
    let Ok(root) = std::env::var("GPUSNAP_STORE_TEST_ROOT") else {
        return;
    };
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    let id = id_of(&data);
    let store = Store::open(Path::new(&root)).unwrap();
    let lease = store.lease().unwrap();
    if std::env::var("GPUSNAP_STORE_TEST_CRASH").is_ok() {
        // Half the blob, then die without any cleanup.
        let Slot::Absent(mut w) = store.begin(&lease, &id, data.len() as u64).unwrap() else {
            panic!("blob already present");
        };
        w.write_all(&data[..data.len() / 2]).unwrap();
        println!("HALF-WRITTEN");
        std::process::abort();
    }
    let wrote = store
        .put(&lease, &id, data.len() as u64, &data[..])
        .unwrap();
    println!("WROTE={wrote}");
}

fn child(root: &Path, crash: bool) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_process_writer",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("GPUSNAP_STORE_TEST_ROOT", root);
    if crash {
        c.env("GPUSNAP_STORE_TEST_CRASH", "1");
    }
    c
}

#[test]
fn concurrent_puts_from_processes_write_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("s");
    Store::open(&root).unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            child(&root, false)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut wrote = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("WROTE="), "{text}");
        wrote += usize::from(text.contains("WROTE=true"));
    }
    assert_eq!(wrote, 1);
    assert_eq!(entries(&root.join("blobs")).len(), 1);
    assert!(entries(&root.join("tmp")).is_empty());
}

#[test]
fn a_crashed_write_is_never_visible_and_is_collected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("s");
    let store = Store::open(&root).unwrap();
    let out = child(&root, true).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("HALF-WRITTEN"));
    // The half-written blob is not in the store, but its temporary file is there.
    assert!(entries(&root.join("blobs")).is_empty());
    let usage = store.usage().unwrap();
    assert_eq!((usage.blobs, usage.temporary_files), (0, 1));
    assert_eq!(usage.temporary_bytes, 1_000_000);
    // The dead writer's lock went with it: a new put writes the blob.
    let out = child(&root, false).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("WROTE=true"));
    let report = store.gc(u64::MAX, false).unwrap();
    assert_eq!(report.removed_temporary_files, 1);
    assert_eq!(report.removed_blobs, 0);
    assert!(entries(&root.join("tmp")).is_empty());
    assert_eq!(entries(&root.join("blobs")).len(), 1);
}

#[test]
fn gc_keeps_referenced_blobs_and_removes_lru_to_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s")).unwrap();
    let holder = dir.path().join("checkpoint");
    std::fs::create_dir(&holder).unwrap();
    let blobs: Vec<(BlobId, Vec<u8>)> = (0..4u8)
        .map(|i| {
            let d = vec![i; 100];
            (id_of(&d), d)
        })
        .collect();
    {
        let lease = store.lease().unwrap();
        for (id, d) in &blobs {
            store.put(&lease, id, 100, &d[..]).unwrap();
        }
        // Blob 0 is the oldest but referenced; 1 is older than 2, older than 3.
        store
            .record(
                &lease,
                &RefRecord {
                    name: "localhost:5000/ckpt/a@sha256:x".into(),
                    source: Some("localhost:5000/ckpt/a".into()),
                    holder: Some(Holder::of(&holder).unwrap()),
                    blobs: vec![blobs[0].0.clone()],
                },
            )
            .unwrap();
        for (i, (id, _)) in blobs.iter().enumerate() {
            set_last_used(&store, id, 1000 - 100 * i as u64);
        }
        // Never while a lease is held.
        let err = store.gc(0, false).unwrap_err();
        assert!(matches!(err, StoreError::Busy { .. }), "{err}");
        assert_eq!(store.usage().unwrap().blobs, 4);
    }
    assert_eq!(
        store.sources_of(&blobs[0].0, "localhost:5000").unwrap(),
        ["localhost:5000/ckpt/a"]
    );
    assert!(store
        .sources_of(&blobs[0].0, "localhost:500")
        .unwrap()
        .is_empty());

    // 400 bytes, cap 250: the two least recently used unreferenced blobs go (1, then 2).
    let r = store.gc(250, false).unwrap();
    assert_eq!(
        (r.removed_blobs, r.freed_bytes, r.kept_bytes),
        (2, 200, 200)
    );
    assert!(store.has(&blobs[0].0).unwrap());
    assert!(!store.has(&blobs[1].0).unwrap());
    assert!(!store.has(&blobs[2].0).unwrap());
    assert!(store.has(&blobs[3].0).unwrap());

    // Cap 0: everything unreferenced goes; the referenced blob stays above the cap.
    let r = store.gc(0, false).unwrap();
    assert_eq!((r.removed_blobs, r.referenced_bytes), (1, 100));
    assert!(store.has(&blobs[0].0).unwrap());

    // A new directory at the holder's path is not the holder: the reference is stale.
    std::fs::remove_dir(&holder).unwrap();
    std::fs::create_dir(&holder).unwrap();
    assert_eq!(store.usage().unwrap().stale_references, 1);
    let r = store.gc(0, false).unwrap();
    assert_eq!((r.removed_references, r.removed_blobs), (1, 1));
    assert_eq!(store.usage().unwrap().blobs, 0);
    assert!(store.refs().unwrap().is_empty());
}

#[test]
fn planted_files_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("s");
    let store = Store::open(&root).unwrap();
    let target = dir.path().join("victim");
    std::fs::write(&target, b"keep me").unwrap();
    let data = b"blob".to_vec();
    let id = id_of(&data);
    std::os::unix::fs::symlink(&target, root.join("blobs").join(id.hex())).unwrap();
    let lease = store.lease().unwrap();
    assert!(!store.has(&id).unwrap(), "a symlink is not a blob");
    assert!(store.put(&lease, &id, 4, &data[..]).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    drop(lease);
    // A symlinked lock file is refused too, never written through.
    std::fs::remove_file(root.join("blobs").join(id.hex())).unwrap();
    std::os::unix::fs::symlink(&target, root.join("locks").join(id.hex())).unwrap();
    let lease = store.lease().unwrap();
    assert!(store.put(&lease, &id, 4, &data[..]).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
}

#[test]
fn a_store_root_owned_by_someone_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("s");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(4242), Some(4242)).unwrap();
    let err = Store::open(&root).unwrap_err();
    assert!(matches!(err, StoreError::NotPrivate { .. }), "{err}");
    // A symlink as the root is refused as well.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    assert!(Store::open(&link).is_err());
}

/// A prehashed writer keeps every check but the hashing: the caller's digest must be the blob's
/// own and the size the declared one, or nothing becomes visible.
#[test]
fn prehashed_writes_commit_only_with_the_blobs_own_digest_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s")).unwrap();
    let lease = store.lease().unwrap();
    let data = b"bytes the caller hashed".to_vec();
    let id = id_of(&data);
    let begin = |size: u64| match store.begin(&lease, &id, size).unwrap() {
        Slot::Absent(w) => w.prehashed(),
        Slot::Present(..) => panic!("present too early"),
    };

    // Another digest: refused, nothing visible, no temporary file left.
    let mut w = begin(data.len() as u64);
    w.write_all(&data).unwrap();
    let e = w.commit(&id_of(b"something else")).unwrap_err();
    assert!(matches!(e, StoreError::DigestMismatch { .. }), "{e}");
    assert!(!store.has(&id).unwrap());
    assert!(entries(&dir.path().join("s/tmp")).is_empty());

    // Short of the declared size: refused.
    let mut w = begin(data.len() as u64);
    w.write_all(&data[1..]).unwrap();
    let e = w.commit(&id).unwrap_err();
    assert!(matches!(e, StoreError::SizeMismatch { .. }), "{e}");
    assert!(!store.has(&id).unwrap());

    // Past it: refused as it is written.
    let mut w = begin(data.len() as u64 - 1);
    assert!(w.write_all(&data).is_err());
    drop(w); // its lock: the next writer of the blob waits for it

    // Its own digest and size: the blob.
    let mut w = begin(data.len() as u64);
    w.write_all(&data).unwrap();
    w.commit(&id).unwrap();
    assert_eq!(read_blob(&store, &id), data);
}

/// Flips one byte of a stored blob in place (the file is 0400; root writes it anyway), as a
/// failing disk or a stray write would.
fn damage(store: &Store, id: &BlobId) {
    use std::os::unix::fs::FileExt;
    let path = store.root().join("blobs").join(id.hex());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut b = [0u8; 1];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    f.write_all_at(&[b[0] ^ 0xff], 0).unwrap();
}

#[test]
fn a_copy_out_of_the_store_is_hashed_and_a_damaged_blob_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s")).unwrap();
    let lease = store.lease().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let id = id_of(&data);
    store
        .put(&lease, &id, data.len() as u64, &data[..])
        .unwrap();

    let sound = tempfile::tempfile().unwrap();
    assert_eq!(
        store.copy_to(&id, &sound).unwrap(),
        gpusnap_node_store::CopyOut::Copied(data.len() as u64)
    );
    damage(&store, &id);
    let copy = tempfile::tempfile().unwrap();
    let out = store.copy_to(&id, &copy).unwrap();
    assert!(
        matches!(out, gpusnap_node_store::CopyOut::Corrupt { ref actual } if *actual != id),
        "{out:?}"
    );
    assert!(!store.has(&id).unwrap(), "the damaged blob is dropped");
    assert_eq!(
        store.copy_to(&id, &tempfile::tempfile().unwrap()).unwrap(),
        gpusnap_node_store::CopyOut::Missing
    );
    // Written again, it is sound.
    assert!(store
        .put(&lease, &id, data.len() as u64, &data[..])
        .unwrap());
    assert_eq!(read_blob(&store, &id), data);
}

#[test]
fn verify_drops_only_damaged_blobs_and_discard_spares_a_rewritten_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s")).unwrap();
    let lease = store.lease().unwrap();
    let blobs: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 100_000 + i as usize]).collect();
    for b in &blobs {
        store
            .put(&lease, &id_of(b), b.len() as u64, &b[..])
            .unwrap();
    }
    let (bad, good) = (id_of(&blobs[2]), id_of(&blobs[4]));
    damage(&store, &bad);
    let report = store.verify_all(&lease).unwrap();
    assert_eq!(report.sound_blobs, 5, "{report:?}");
    assert_eq!(report.dropped.len(), 1, "{report:?}");
    assert_eq!(report.dropped[0].id, bad);
    assert!(!store.has(&bad).unwrap());
    assert!(store.has(&good).unwrap());
    assert!(matches!(
        store.verify(&good).unwrap(),
        gpusnap_node_store::Health::Sound(_)
    ));

    // A reader found the blob damaged, but meanwhile it was dropped and written again by
    // someone else: the sound copy stays.
    store
        .put(&lease, &bad, blobs[2].len() as u64, &blobs[2][..])
        .unwrap();
    let stale = tempfile::tempfile().unwrap();
    assert!(!store.discard(&bad, &stale, &good).unwrap());
    assert_eq!(read_blob(&store, &bad), blobs[2]);
}
