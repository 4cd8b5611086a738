//! The node store through the `gpusnap` CLI against a real `docker-registry`: a pull fetches
//! only the blobs the node lacks, a push uploads (or mounts) only what the registry lacks, a
//! failed pull leaves no blob behind, and `gpusnap store ls|du|gc` show and collect it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpusnap_testkit::fixtures::{fixture, tree};
use gpusnap_testkit::{describe, paths};
use serde_json::Value;

mod common;
use common::{json, registry, s};

fn gpusnap(config: &Path, args: &[&str]) -> Output {
    Command::new(paths::binary("gpusnap"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("COLUMNS", "200")
        .env_remove("GPUSNAP_LOG")
        .output()
        .unwrap()
}

fn ok(config: &Path, args: &[&str]) -> Output {
    let out = gpusnap(config, args);
    assert!(out.status.success(), "gpusnap {args:?}: {}", describe(&out));
    out
}

/// A config with its own checkpoint root and node store under `dir`.
fn config(dir: &Path) -> (PathBuf, PathBuf) {
    let store = dir.join("store");
    let p = dir.join("gpusnap.toml");
    fs::write(
        &p,
        format!(
            "[restore]\ncheckpoint_root = \"{}\"\n\n[store]\nroot = \"{}\"\nmax_bytes = \"1GiB\"\n",
            dir.join("checkpoints").display(),
            store.display()
        ),
    )
    .unwrap();
    (p, store)
}

fn store_blobs(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(store.join("blobs"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

fn layer_digests(built: &Value) -> Vec<String> {
    built["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["descriptor"]["digest"].as_str().unwrap().to_owned())
        .collect()
}

/// `gpusnap image build SOURCE -t REFERENCE --layout LAYOUT`, then a plain-HTTP push of the
/// layout to `reference`; returns the build's JSON report.
fn build_and_push(cfg: &Path, source: &Path, layout: &Path, reference: &str) -> Value {
    let built = json(&ok(
        cfg,
        &[
            "image",
            "build",
            s(source),
            "-t",
            reference,
            "--layout",
            s(layout),
            "--json",
        ],
    ));
    ok(
        cfg,
        &["image", "push", s(layout), reference, "--plain-http"],
    );
    built
}

#[test]
fn pulls_fetch_only_missing_blobs_and_pushes_upload_only_missing_ones() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (cfg, store) = config(w);

    // Two images of the same checkpoint (different annotations): the same layers.
    let (ref_a, ref_b) = (reg.image("ckpt/a:v1"), reg.image("ckpt/b:v1"));
    let (lay_a, lay_b) = (w.join("a.layout"), w.join("b.layout"));
    let built = json(&ok(
        &cfg,
        &[
            "image",
            "build",
            s(&fx.archive),
            "-t",
            &ref_a,
            "--layout",
            s(&lay_a),
            "--json",
        ],
    ));
    ok(
        &cfg,
        &[
            "image",
            "build",
            s(&fx.archive),
            "-t",
            &ref_b,
            "--layout",
            s(&lay_b),
            "--annotation",
            "replica=2",
        ],
    );
    let layers = layer_digests(&built);
    assert!(layers.len() >= 2, "{built:#}");

    // First push uploads everything; the summary says so beside the image size.
    let pushed = json(&ok(
        &cfg,
        &["image", "push", s(&lay_a), &ref_a, "--plain-http", "--json"],
    ));
    let t = &pushed["transfer"];
    assert_eq!(t["moved_blobs"], t["blobs"], "{pushed:#}");
    assert_eq!(t["present_blobs"], 0);
    // Again: nothing uploaded.
    let out = ok(&cfg, &["image", "push", s(&lay_a), &ref_a, "--plain-http"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("uploaded 0 B of"), "{text}");
    assert!(text.contains("already present"), "{text}");
    // Image B into another repository: the store knows repository ckpt/a holds its blobs, so
    // the registry mounts them instead of receiving them again.
    let pushed = json(&ok(
        &cfg,
        &["image", "push", s(&lay_b), &ref_b, "--plain-http", "--json"],
    ));
    let t = &pushed["transfer"];
    assert_eq!(t["moved_bytes"], 0, "{pushed:#}");
    assert_eq!(t["mounted_blobs"], t["blobs"], "{pushed:#}");
    let links = reg
        .storage_dir()
        .join("docker/registry/v2/repositories/ckpt/b/_layers/sha256");
    for d in &layers {
        assert!(
            links
                .join(d.trim_start_matches("sha256:"))
                .join("link")
                .is_file(),
            "layer {d} not linked into ckpt/b"
        );
    }

    // Pull A: every blob downloaded into the store, the checkpoint extracted.
    let pulled = json(&ok(
        &cfg,
        &[
            "image",
            "pull",
            &ref_a,
            "--plain-http",
            "--extract",
            "a",
            "--json",
        ],
    ));
    let t = &pulled["pull"]["transfer"];
    assert_eq!(t["present_blobs"], 0, "{pulled:#}");
    assert_eq!(t["moved_blobs"], t["blobs"]);
    for d in &layers {
        assert!(
            store_blobs(&store).contains(d),
            "layer {d} not in the store"
        );
    }

    // Take the layers' bytes away from the registry: B can only be pulled from the store now.
    for d in &layers {
        fs::remove_file(reg.blob_data(d)).unwrap();
    }
    let out = ok(
        &cfg,
        &["image", "pull", &ref_b, "--plain-http", "--extract", "b"],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!("({} already present)", layers.len()))
            || text.contains(&format!("; {} already present", layers.len())),
        "{text}"
    );
    let dest = w.join("checkpoints/b");
    let mut got = tree(&dest);
    assert!(got.remove("gpusnap-origin.json").is_some());
    assert_eq!(got, tree(&fx.archive_root));
    // A layout pull of B (blobs copied out of the store into the layout) works as well.
    let pulled = json(&ok(
        &cfg,
        &[
            "image",
            "pull",
            &ref_b,
            "--plain-http",
            "--layout",
            s(&w.join("b.pulled")),
            "--json",
        ],
    ));
    // (Its config was downloaded: extracting pulls read the config into memory, not the store.)
    assert_eq!(pulled["pull"]["transfer"]["present_blobs"], layers.len());
    assert_eq!(pulled["pull"]["transfer"]["moved_blobs"], 1);
    for d in &layers {
        let hex = d.trim_start_matches("sha256:");
        let copy = fs::read(w.join("b.pulled/blobs/sha256").join(hex)).unwrap();
        assert_eq!(copy, fs::read(store.join("blobs").join(hex)).unwrap());
    }

    // The operator's view: references for both checkpoints and the layout.
    let du = json(&ok(&cfg, &["store", "du", "--json"]));
    assert_eq!(du["temporary_files"], 0, "{du:#}");
    assert!(du["references"].as_u64().unwrap() >= 3, "{du:#}");
    let ls = String::from_utf8(ok(&cfg, &["store", "ls"]).stdout).unwrap();
    assert!(ls.contains(&layers[0]), "{ls}");
    // Referenced blobs survive a collection to 0 bytes; once every holder is gone, they go.
    let before = store_blobs(&store).len();
    let r = json(&ok(&cfg, &["store", "gc", "--max-bytes", "0", "--json"]));
    assert_eq!(
        store_blobs(&store).len() + r["removed_blobs"].as_u64().unwrap() as usize,
        before
    );
    for d in &layers {
        assert!(
            store_blobs(&store).contains(d),
            "referenced layer {d} collected"
        );
    }
    for holder in [
        "checkpoints/a",
        "checkpoints/b",
        "b.pulled",
        "a.layout",
        "b.layout",
    ] {
        fs::remove_dir_all(w.join(holder)).unwrap();
    }
    let r = json(&ok(&cfg, &["store", "gc", "--max-bytes", "0", "--json"]));
    assert!(r["removed_references"].as_u64().unwrap() >= 3, "{r:#}");
    assert!(store_blobs(&store).is_empty(), "{:?}", store_blobs(&store));
}

#[test]
fn a_failed_pull_leaves_no_blob_in_the_store() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (cfg, store) = config(w);
    let reference = reg.image("ckpt/damaged:v1");
    let layout = w.join("layout");
    // Build and push, then damage one layer in the registry.
    let built = build_and_push(&cfg, &fx.archive, &layout, &reference);
    let layers = layer_digests(&built);
    let victim = layers.last().unwrap();
    let data = reg.blob_data(victim);
    let mut bytes = fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&data, &bytes).unwrap();

    for extra in [
        &["--extract", "x"][..],
        &["--layout", s(&w.join("pulled"))][..],
    ] {
        let mut args = vec!["image", "pull", reference.as_str(), "--plain-http"];
        args.extend_from_slice(extra);
        let out = gpusnap(&cfg, &args);
        assert!(!out.status.success(), "{}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(victim.as_str()), "{err}");
        assert!(!store_blobs(&store).contains(victim), "damaged blob kept");
        let du = json(&ok(&cfg, &["store", "du", "--json"]));
        assert_eq!(du["temporary_files"], 0, "{du:#}");
    }
    assert!(!w.join("checkpoints/x").exists());
    assert!(!w.join("pulled").exists());
}

/// A TCP relay in front of the registry that passes everything, except that on a connection
/// whose request names `stall`, it stops relaying the response after `after` bytes (the
/// download then hangs mid-blob, until the process is killed or interrupted), or, with
/// `throttle`, relays it at about 1 MiB/s.
fn stalling_proxy(upstream: u16, stall: String, after: usize, throttle: bool) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                return;
            };
            let hit = Arc::new(AtomicBool::new(false));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (h, needle) = (hit.clone(), stall.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = c_in.read(&mut buf) {
                    // Marked before the request is relayed: marked after, a quick response
                    // could pass unstalled and the connection's next request stall instead.
                    if String::from_utf8_lossy(&buf[..n]).contains(&needle) {
                        h.store(true, Ordering::SeqCst);
                    }
                    if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 16 << 10];
                let mut sent = 0;
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let n = if hit.load(Ordering::SeqCst) && !throttle {
                        n.min(after.saturating_sub(sent))
                    } else {
                        n
                    };
                    if hit.load(Ordering::SeqCst) && throttle {
                        // Rate limiting, not synchronisation: 16 KiB per 16 ms.
                        std::thread::sleep(std::time::Duration::from_millis(16));
                    }
                    if n == 0 {
                        // Hold the connection open, relaying nothing more.
                        std::thread::park();
                        continue;
                    }
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    sent += n;
                }
            });
        }
    });
    port
}

#[test]
fn an_interrupted_or_killed_pull_leaves_no_visible_partial_blob() {
    use std::time::Duration;
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (cfg, store) = config(w);
    let reference = reg.image("ckpt/slow:v1");
    let layout = w.join("layout");
    let built = build_and_push(&cfg, &fx.archive, &layout, &reference);
    // The largest layer stalls a quarter of the way in.
    let (victim, size) = built["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["descriptor"]["digest"].as_str().unwrap().to_owned(),
                l["descriptor"]["size"].as_u64().unwrap(),
            )
        })
        .max_by_key(|l| l.1)
        .unwrap();
    assert!(size > 1 << 20, "largest layer is only {size} bytes");
    let port = stalling_proxy(reg.port(), victim.clone(), (size / 4) as usize, false);
    let via_proxy = format!("127.0.0.1:{port}/ckpt/slow:v1");
    let tmp_bytes = |store: &Path| -> u64 {
        fs::read_dir(store.join("tmp"))
            .map(|d| d.map(|e| e.unwrap().metadata().unwrap().len()).sum())
            .unwrap_or(0)
    };

    for signal in [
        nix::sys::signal::Signal::SIGKILL,
        nix::sys::signal::Signal::SIGINT,
    ] {
        let child = Command::new(paths::binary("gpusnap"))
            .arg("--config")
            .arg(&cfg)
            .args([
                "image",
                "pull",
                &via_proxy,
                "--plain-http",
                "--extract",
                "slow",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Part of the victim is in the store's temporary file: the download is mid-blob.
        assert!(
            gpusnap_testkit::wait_until(Duration::from_secs(30), || tmp_bytes(&store) > 0),
            "the pull never started writing the stalled layer"
        );
        // Only the child this test started, by its pid.
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{}", describe(&out));
        // stderr is not a terminal: no progress line.
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("/s)"),
            "{}",
            describe(&out)
        );
        // Never visible as a blob, and no checkpoint.
        assert!(
            !store_blobs(&store).contains(&victim),
            "partial blob visible"
        );
        assert!(!w.join("checkpoints/slow").exists());
        let du = json(&ok(&cfg, &["store", "du", "--json"]));
        if signal == nix::sys::signal::Signal::SIGKILL {
            // A crash leaves temporary files (the stalled layer's and any other in flight);
            // the next collection removes them.
            let n = du["temporary_files"].as_u64().unwrap();
            assert!(n >= 1, "{du:#}");
            let r = json(&ok(&cfg, &["store", "gc", "--json"]));
            assert_eq!(r["removed_temporary_files"], n, "{r:#}");
        } else {
            // An interrupted pull removes its own.
            assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
            assert_eq!(du["temporary_files"], 0, "{du:#}");
        }
        assert_eq!(tmp_bytes(&store), 0);
    }
    // On a terminal, a slow pull draws its progress (the stalled layer now relayed slowly).
    let port = stalling_proxy(reg.port(), victim.clone(), 0, true);
    let mut cmd = Command::new(paths::binary("gpusnap"));
    cmd.arg("--config").arg(&cfg).args([
        "image",
        "pull",
        &format!("127.0.0.1:{port}/ckpt/slow:v1"),
        "--plain-http",
        "--extract",
        "slow",
    ]);
    let out = gpusnap_testkit::pty::run_in_pty(cmd, Duration::from_secs(120)).unwrap();
    let text = out.text();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("downloaded ") && text.contains(" blobs, ") && text.contains("/s)"),
        "no progress line: {text}"
    );
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("already present)"), "{text}");
    // The blob counter counts what moves: never more done than expected.
    for line in text.split("\x1b[2K").filter(|l| l.contains(" blobs, ")) {
        let counts = line.split('(').nth(1).unwrap().split(' ').next().unwrap();
        let (done, total) = counts.split_once('/').unwrap();
        assert!(
            done.parse::<u64>().unwrap() <= total.parse().unwrap(),
            "{line}"
        );
    }
    // Every stored blob matches its name.
    for d in store_blobs(&store) {
        let bytes = fs::read(store.join("blobs").join(d.trim_start_matches("sha256:"))).unwrap();
        use sha2::Digest as _;
        let hex: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(d, format!("sha256:{hex}"));
    }
}

/// Flips one byte in the middle of the stored blob `digest` (the file is 0400; root writes it
/// anyway), as a failing disk or a stray write would.
fn damage_stored(store: &Path, digest: &str) {
    use std::os::unix::fs::FileExt;
    let path = store
        .join("blobs")
        .join(digest.trim_start_matches("sha256:"));
    let len = fs::metadata(&path).unwrap().len();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, len / 2).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], len / 2).unwrap();
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest as _;
    let bytes = fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every blob file under `blobs` hashes to its name.
fn all_sound(blobs: &Path) {
    for e in fs::read_dir(blobs).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(
            sha256_hex(&p),
            p.file_name().unwrap().to_string_lossy(),
            "{} is not the blob its name says",
            p.display()
        );
    }
}

/// A blob damaged in the node store no longer breaks every later pull (issue 28, finding 8):
/// an extracting pull drops it and downloads it again in the same run, a layout pull hashes
/// what it copies out of the store and heals the same way (exit 0, every blob of the layout
/// sound), and `gpusnap store verify` / `gc` find and drop damaged blobs nobody pulled.
#[test]
fn a_damaged_store_blob_is_dropped_and_fetched_again() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (cfg, store) = config(w);
    let reference = reg.image("ckpt/heal:v1");
    let built = build_and_push(&cfg, &fx.archive, &w.join("layout"), &reference);
    let layers = layer_digests(&built);
    ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "first",
        ],
    );
    // The largest layer: its bytes go through the unpacker (or the copy) well before the end.
    let victim = built["layers"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|l| l["descriptor"]["size"].as_u64().unwrap())
        .unwrap()["descriptor"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = store
        .join("blobs")
        .join(victim.trim_start_matches("sha256:"));

    // An extracting pull: healed within the run.
    damage_stored(&store, &victim);
    let pulled = json(&ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "second",
            "--json",
        ],
    ));
    // Downloaded: the damaged blob, and the config (an extracting pull always fetches it).
    assert_eq!(
        pulled["pull"]["transfer"]["moved_blobs"], 2,
        "only the damaged blob is downloaded again: {pulled:#}"
    );
    let mut got = tree(&w.join("checkpoints/second"));
    assert!(got.remove("gpusnap-origin.json").is_some());
    assert_eq!(got, tree(&fx.archive_root));
    assert_eq!(sha256_hex(&stored), victim.trim_start_matches("sha256:"));

    // A layout pull: the copy out of the store is hashed, the blob dropped and fetched again.
    damage_stored(&store, &victim);
    let layout = w.join("pulled.layout");
    ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--layout",
            s(&layout),
        ],
    );
    all_sound(&layout.join("blobs/sha256"));
    for d in &layers {
        assert!(
            layout
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:"))
                .is_file(),
            "{d} missing from the layout"
        );
    }
    assert_eq!(sha256_hex(&stored), victim.trim_start_matches("sha256:"));

    // With the registry unable to serve it, the pull fails, but the damaged blob is gone from
    // the store: nothing keeps handing it out.
    damage_stored(&store, &victim);
    let saved = fs::read(reg.blob_data(&victim)).unwrap();
    fs::remove_file(reg.blob_data(&victim)).unwrap();
    let out = gpusnap(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "third",
        ],
    );
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(!stored.exists(), "the damaged blob stayed in the store");
    assert!(!w.join("checkpoints/third").exists());
    fs::write(reg.blob_data(&victim), saved).unwrap();
    ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "third",
        ],
    );
    all_sound(&store.join("blobs"));

    // Damage nobody has read yet: `store verify` finds and drops it, and so does `gc`.
    damage_stored(&store, &victim);
    let v = json(&ok(&cfg, &["store", "verify", "--json"]));
    assert_eq!(v["dropped"][0]["id"], victim.as_str(), "{v:#}");
    assert!(!stored.exists());
    ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "fourth",
        ],
    );
    damage_stored(&store, &victim);
    let g = json(&ok(&cfg, &["store", "gc", "--json"]));
    assert_eq!(g["verified"]["dropped"][0]["id"], victim.as_str(), "{g:#}");
    assert!(!stored.exists());
    all_sound(&store.join("blobs"));
}

/// The staging directories (`.NAME.extract-*`) of the pulls under the checkpoint root.
fn stagings(root: &Path, name: &str) -> Vec<PathBuf> {
    fs::read_dir(root)
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&format!(".{name}.extract-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `gpusnap image pull REF --extract NAME`, running.
fn spawn_pull(cfg: &Path, reference: &str, name: &str) -> std::process::Child {
    Command::new(paths::binary("gpusnap"))
        .arg("--config")
        .arg(cfg)
        .args([
            "image",
            "pull",
            reference,
            "--plain-http",
            "--extract",
            name,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A pull killed with SIGKILL mid-extract leaves its staging directory (a whole checkpoint,
/// decrypted for an encrypted image) in the checkpoint root; the next pull removes it, and so
/// does `gpusnap store gc`, while a live pull's staging directory is never touched
/// (issue 28, finding 8). The killed pull's partial blobs in the store are collected too.
#[test]
fn a_killed_pulls_staging_is_removed_by_the_next_pull_and_by_gc() {
    use std::time::Duration;
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (cfg, store) = config(w);
    let root = w.join("checkpoints");
    let reference = reg.image("ckpt/staging:v1");
    let built = build_and_push(&cfg, &fx.archive, &w.join("layout"), &reference);
    let (victim, size) = built["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["descriptor"]["digest"].as_str().unwrap().to_owned(),
                l["descriptor"]["size"].as_u64().unwrap(),
            )
        })
        .max_by_key(|l| l.1)
        .unwrap();
    let port = stalling_proxy(reg.port(), victim.clone(), (size / 4) as usize, false);
    let mid_layer = format!("127.0.0.1:{port}/ckpt/staging:v1");
    // A pull stalled on the image config holds no blob's lock: another pull of the same image
    // can complete beside it.
    let config_digest = built["config_digest"].as_str().unwrap().to_owned();
    let port = stalling_proxy(reg.port(), config_digest, 0, false);
    let at_config = format!("127.0.0.1:{port}/ckpt/staging:v1");
    let tmp_files = |store: &Path| fs::read_dir(store.join("tmp")).map_or(0, |d| d.count());
    // A pull stalled mid-layer (its staging directory exists and the layer is half in the
    // store's temporary file), or at the config (its staging directory exists).
    let stall = |name: &str, mid: bool| {
        let child = spawn_pull(&cfg, if mid { &mid_layer } else { &at_config }, name);
        assert!(
            gpusnap_testkit::wait_until(Duration::from_secs(30), || {
                stagings(&root, name).len() == 1 && (!mid || tmp_files(&store) > 0)
            }),
            "the pull of {name} never got to its stall"
        );
        child
    };
    let kill = |child: std::process::Child, signal| {
        // Only the child this test started, by its pid.
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        child.wait_with_output().unwrap()
    };

    let killed = stall("killed", true);
    kill(killed, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(stagings(&root, "killed").len(), 1, "SIGKILL left nothing?");

    // Another pull runs (stalled) while a third completes: the third removes the killed pull's
    // staging directory and leaves the live one's alone.
    let live = stall("live", false);
    let live_staging = stagings(&root, "live");
    ok(
        &cfg,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "done",
        ],
    );
    assert!(
        stagings(&root, "killed").is_empty(),
        "the next pull left the killed pull's staging directory"
    );
    assert_eq!(
        stagings(&root, "live"),
        live_staging,
        "a live pull's staging was touched"
    );
    assert!(live_staging[0].is_dir());
    let out = kill(live, nix::sys::signal::Signal::SIGINT);
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(stagings(&root, "live").is_empty());

    // Killed again (stalled at the config); this time `gpusnap store gc` finds it, and the
    // first killed pull's partial blob with it.
    let killed = stall("again", false);
    kill(killed, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(stagings(&root, "again").len(), 1);
    let g = json(&ok(&cfg, &["store", "gc", "--json"]));
    let removed: Vec<&str> = g["removed_staging_directories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(removed.len(), 1, "{g:#}");
    assert!(removed[0].contains("/.again.extract-"), "{g:#}");
    assert!(stagings(&root, "again").is_empty());
    assert!(g["removed_temporary_files"].as_u64().unwrap() >= 1, "{g:#}");
    assert_eq!(tmp_files(&store), 0);
    assert!(root.join("done/checkpoint").is_dir());
}
