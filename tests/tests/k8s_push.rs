//! Checkpoint to a registry from the kubelet API alone (issue 30, the checkpoint half), end to
//! end without a kubelet: the node agent runs as the installer DaemonSet runs it (`gpusnap
//! agent run --checkpoint-dir`, started before anything is checkpointed), a pod under the
//! `gpusnap` handler is annotated `gpusnap.io/checkpoint-to: REGISTRY/REPOSITORY`, and the only
//! thing done on "node A" is the CRI call the kubelet's checkpoint API makes
//! (`CheckpointContainer` through the real crictl, `--export` into the watched directory under
//! a name as the kubelet gives it). The registry serves HTTPS with its own CA and requires a
//! password; the agent has the CA and the credentials from its config, as the chart gives
//! them.
//!
//! - the image appears under `<container>-<time>-<node>` and `latest`, signed by the node's key;
//!   the status file, the agent's log and an Event on the pod say so; "node B" (its own
//!   containerd and node store, signatures required) pulls it by the stable tag and a pod
//!   annotated `gpusnap.io/restore-from` restores it: the counter carries on;
//! - a restarted agent does not push the archive again;
//! - a "CUDA" container (the driver double, the posix engine: device memory in
//!   `gpusnap-gpu-*` files) pushed the same way restores on node B with its device memory;
//! - a destination outside `checkpoint.allowed_destinations` (an archive written before the
//!   agent started), a registry that does not answer (after the bounded retries) and a
//!   registry that refuses the node's credentials: nothing is pushed, and the status file, the
//!   log and an Event say why; an archive of a pod without the annotation is left alone.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::busybox_registry::{registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::cmd::{check, gpusnap_ok};
use gpusnap_testkit::counter::{check_continues, count_of, wait_count, COUNTER, WARM};
use gpusnap_testkit::cri::gpusnap_handler;
use gpusnap_testkit::crictl::PidMode;
use gpusnap_testkit::gpu::{Cuda, Engine, GpuDouble};
use gpusnap_testkit::push_agent::{AgentSetup, FakeApi, NodeAgent};
use gpusnap_testkit::registry::{free_tcp_port, RegistrySetup};
use gpusnap_testkit::signing::{keypair, set_policy, CriSigNode, Policy, Running};
use gpusnap_testkit::Registry;

/// A push of a small checkpoint takes seconds; a loaded 2-core machine can take much longer.
const PUSHED_WITHIN: Duration = Duration::from_secs(300);

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// The kubelet's archive name: `checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar`.
fn kubelet_name(pod: &str) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    let now = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    format!("checkpoint-{pod}_default-counter-{now}.tar")
}

/// The kubelet's checkpoint directory stand-in: root-only, as the kubelet makes it.
fn checkpoint_dir(work: &Path) -> Result<std::path::PathBuf> {
    let d = work.join("kubelet/checkpoints");
    fs::create_dir_all(&d)?;
    fs::set_permissions(&d, fs::Permissions::from_mode(0o700))?;
    Ok(d)
}

/// `crictl inspectp`'s pod uid (what the kubelet would have set from `metadata.uid`).
fn pod_uid(node: &CriSigNode, pod: &Running) -> Result<String> {
    let v: serde_json::Value =
        serde_json::from_str(&node.crictl.ok(&["inspectp", "-o", "json", &pod.pod.id])?)?;
    v["status"]["metadata"]["uid"]
        .as_str()
        .map(str::to_owned)
        .context("crictl inspectp shows no uid")
}

/// `gpusnap image pull REF --layout DIR --json` with the registry's CA and credentials: the
/// digest the reference resolves to.
fn digest_of(reference: &str, ca: &Path, docker: &Path, work: &Path) -> Result<String> {
    let layout = work.join(gpusnap_testkit::unique("layout"));
    let out = gpusnap_ok(&[
        "--config",
        "/dev/null",
        "image",
        "pull",
        &format!("https://{reference}"),
        "--layout",
        s(&layout),
        "--ca-file",
        s(ca),
        "--registry-config",
        s(docker),
        "--json",
    ])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v["pull"]["digest"].as_str().unwrap_or_default().to_owned())
}

/// Repositories a registry holds (its filesystem storage).
fn repositories(reg: &Registry) -> Vec<String> {
    let root = reg.storage_dir().join("docker/registry/v2/repositories");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.join("_manifests").is_dir() {
                out.push(p.strip_prefix(&root).unwrap_or(&p).display().to_string());
            } else if p.is_dir() && !e.file_name().to_string_lossy().starts_with('_') {
                stack.push(p);
            }
        }
    }
    out
}

#[test]
fn checkpoint_to_pushes_the_cri_checkpoint_and_another_node_restores_it() {
    check(|| {
        let base = registry_with_busybox()?;
        let busybox = base.image(BUSYBOX_REPO);
        let dest = Registry::start_with(RegistrySetup::secure())?;
        let work = tempfile::tempdir()?;
        let key = keypair(work.path(), "node-a")?;
        let docker = dest.write_docker_config(&work.path().join("docker"))?;
        let ca = dest.ca_file().context("a TLS registry has a CA")?;
        let api = FakeApi::start(&ca)?;
        let watched = checkpoint_dir(work.path())?;
        let node_a = CriSigNode::start_with_config(&base.host(), &busybox, "")?;
        let config = format!(
            "[checkpoint]\nsigning_key = {:?}\nallowed_destinations = [\"{}/ckpt/*\"]\n\
             registry_config = {:?}\nregistry_ca_files = [{:?}]\n\n[store]\nroot = {:?}\n",
            s(&key.private),
            dest.host(),
            s(&docker),
            s(&ca),
            s(&work.path().join("store-a")),
        );
        let setup = AgentSetup {
            checkpoint_dir: &watched,
            config,
            node: "node-a",
            api: Some(&api),
        };
        let agent_dir = work.path().join("agent-a");
        let mut agent = NodeAgent::start(&setup, &agent_dir)?;

        // The pod asks for its checkpoints to go to the registry; then the kubelet's CRI call.
        let repo = format!("{}/ckpt/counter", dest.host());
        let pod = node_a
            .start_pod("trainer", &[("gpusnap.io/checkpoint-to", &repo)], &busybox)?
            .running()?;
        wait_count(&node_a.run, "trainer", WARM, || count_of(pod.pid))?;
        let name = kubelet_name("trainer");
        let archive = watched.join(&name);
        let checkpointed = node_a.checkpoint(&pod, &archive)?;
        let archive_bytes = fs::read(&archive)?;

        let rec = agent.wait_state(&name, "pushed", PUSHED_WITHIN)?;
        let refs: Vec<String> = rec["references"]
            .as_array()
            .context("references")?
            .iter()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        let digest = rec["digest"].as_str().unwrap_or_default().to_owned();
        ensure!(refs.len() == 2, "two tags expected: {rec}");
        let unique = refs[0]
            .strip_prefix(&format!("{repo}:"))
            .with_context(|| format!("{} is not in {repo}", refs[0]))?;
        ensure!(
            unique.starts_with("counter-") && unique.ends_with("Z-node-a") && unique.len() == 31,
            "the unique tag is <container>-<YYYYMMDDTHHMMSSZ>-<node>: {unique}"
        );
        ensure!(refs[1] == format!("{repo}:latest"), "{rec}");
        ensure!(rec["signed"] == true, "not signed by the node key: {rec}");
        ensure!(
            rec["pod"]["name"] == "trainer" && rec["pod"]["namespace"] == "default",
            "{rec}"
        );
        ensure!(digest.starts_with("sha256:"), "{rec}");
        for r in &refs {
            let d = digest_of(r, &ca, &docker, work.path())?;
            ensure!(d == digest, "{r} resolves to {d}, the status says {digest}");
        }
        ensure!(
            fs::read(&archive)? == archive_bytes,
            "the archive changed or moved: it stays where the kubelet put it"
        );
        let uid = pod_uid(&node_a, &pod)?;
        let ev = api.wait_event("trainer", "CheckpointPushed", Duration::from_secs(30))?;
        ensure!(
            ev["type"] == "Normal"
                && ev["involvedObject"]["namespace"] == "default"
                && ev["involvedObject"]["uid"] == uid.as_str()
                && ev["metadata"]["namespace"] == "default"
                && ev["message"].as_str().is_some_and(|m| m.contains(&digest)),
            "event: {ev}"
        );
        let log = agent.log();
        ensure!(
            log.contains("checkpoint pushed") && log.contains(&digest),
            "the agent's log does not report the push:\n{log}"
        );
        ensure!(
            fs::read_dir(agent.status_dir().join(".work"))?
                .next()
                .is_none(),
            "the agent left its scratch behind"
        );

        // Node B: signatures required, node A's key trusted; pulled by the stable tag, restored
        // by pod annotation, with nothing else done on it.
        let node_b = CriSigNode::start_with_config(&base.host(), &busybox, "")?;
        set_policy(
            node_b.node.config_path(),
            &Policy {
                policy: "require",
                trusted: vec![&key.public],
                signing_key: None,
            },
        )?;
        gpusnap_ok(&[
            "--config",
            s(node_b.node.config_path()),
            "image",
            "pull",
            &format!("https://{}", refs[1]),
            "--extract",
            "ck-pushed",
            "--ca-file",
            s(&ca),
            "--registry-config",
            s(&docker),
        ])?;
        node_b
            .restore(
                "restored",
                &busybox,
                &[("gpusnap.io/restore-from", "ck-pushed")],
                &checkpointed,
            )?
            .running()?;

        // A restarted agent (a rolled DaemonSet pod) finds the archive handled.
        agent.stop()?;
        let agent = NodeAgent::start(&setup, &agent_dir)?;
        agent.wait_log("archive already handled", Duration::from_secs(60))?;
        ensure!(
            agent.status(&name).as_ref() == Some(&rec),
            "the restarted agent touched the record: {:?}",
            agent.status(&name)
        );
        ensure!(
            !agent.log().contains("pushing checkpoint"),
            "the restarted agent pushed again:\n{}",
            agent.log()
        );
        Ok(())
    })
}

#[test]
fn checkpoint_to_refusals_push_nothing_and_say_why() {
    check(|| {
        let base = registry_with_busybox()?;
        let busybox = base.image(BUSYBOX_REPO);
        let dest = Registry::start_with(RegistrySetup::secure())?;
        // A second registry whose password the node does not have.
        let other = Registry::start_with(RegistrySetup::secure())?;
        let dead = format!("127.0.0.1:{}", free_tcp_port()?);
        let work = tempfile::tempdir()?;
        let docker = dest.write_docker_config(&work.path().join("docker"))?;
        let ca = dest.ca_file().context("CA")?;
        let other_ca = other.ca_file().context("CA")?;
        let api = FakeApi::start(&ca)?;
        let watched = checkpoint_dir(work.path())?;
        let node = CriSigNode::start_with_config(&base.host(), &busybox, "")?;
        let allowed = [
            format!("{}/ckpt/*", dest.host()),
            format!("{dead}/ckpt/*"),
            format!("{}/ckpt/*", other.host()),
        ];
        let config = format!(
            "[checkpoint]\nallowed_destinations = {:?}\nregistry_config = {:?}\n\
             registry_ca_files = [{:?}, {:?}]\npush_attempts = 3\npush_retry_seconds = 1\n\n\
             [store]\nroot = {:?}\n",
            allowed,
            s(&docker),
            s(&ca),
            s(&other_ca),
            s(&work.path().join("store")),
        );
        let run = |name: &str, to: Option<&str>| -> Result<(Running, String)> {
            let ann: Vec<(&str, &str)> = to
                .map(|t| vec![("gpusnap.io/checkpoint-to", t)])
                .unwrap_or_default();
            let pod = node.start_pod(name, &ann, &busybox)?.running()?;
            wait_count(&node.run, name, WARM, || count_of(pod.pid))?;
            let archive = kubelet_name(name);
            node.checkpoint(&pod, &watched.join(&archive))?;
            Ok((pod, archive))
        };

        // Written while no agent ran: the agent finds it when it starts.
        let elsewhere = format!("{}/elsewhere/x", dest.host());
        let (_evil, evil) = run("evil", Some(&elsewhere))?;
        let agent = NodeAgent::start(
            &AgentSetup {
                checkpoint_dir: &watched,
                config,
                node: "node-a",
                api: Some(&api),
            },
            &work.path().join("agent"),
        )?;
        let rec = agent.wait_state(&evil, "refused", Duration::from_secs(60))?;
        let reason = rec["reason"].as_str().unwrap_or_default();
        ensure!(
            rec["destination"] == elsewhere.as_str()
                && reason.contains("not a destination this node may push to")
                && reason.contains(&allowed[0])
                && reason.contains("checkpoint.allowed_destinations"),
            "{rec}"
        );
        let ev = api.wait_event("evil", "CheckpointPushRefused", Duration::from_secs(30))?;
        ensure!(ev["type"] == "Warning", "{ev}");

        // The registry does not answer: retried, then reported.
        let (_down, down) = run("down", Some(&format!("{dead}/ckpt/down")))?;
        let rec = agent.wait_state(&down, "failed", Duration::from_secs(180))?;
        ensure!(
            rec["attempts"] == 3
                && rec["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("registry unreachable") && r.contains(&dead)),
            "{rec}"
        );
        ensure!(
            agent.log().matches("retrying").count() >= 2,
            "two retries expected in the log:\n{}",
            agent.log()
        );
        api.wait_event("down", "CheckpointPushFailed", Duration::from_secs(30))?;

        // The registry refuses the node's (absent) credentials: not retried.
        let (_noauth, noauth) = run("noauth", Some(&format!("{}/ckpt/x", other.host())))?;
        let rec = agent.wait_state(&noauth, "failed", PUSHED_WITHIN)?;
        ensure!(
            rec["attempts"] == 1
                && rec["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("authentication")),
            "{rec}"
        );
        api.wait_event("noauth", "CheckpointPushFailed", Duration::from_secs(30))?;

        // No annotation: left alone, no event.
        let (_plain, plain) = run("plain", None)?;
        agent.wait_state(&plain, "not-requested", Duration::from_secs(60))?;

        let log = agent.log();
        for want in ["checkpoint push refused", "checkpoint push failed"] {
            ensure!(log.contains(want), "{want:?} missing from the log:\n{log}");
        }
        ensure!(
            !api.events()
                .iter()
                .any(|e| e["involvedObject"]["name"] == "plain"),
            "an event about a pod that asked for nothing"
        );
        ensure!(
            repositories(&dest).is_empty() && repositories(&other).is_empty(),
            "something was pushed: {:?} {:?}",
            repositories(&dest),
            repositories(&other)
        );
        for a in [&evil, &down, &noauth, &plain] {
            ensure!(watched.join(a).is_file(), "{a} is gone");
        }
        ensure!(
            fs::read_dir(agent.status_dir().join(".work"))?
                .next()
                .is_none(),
            "the agent left its scratch behind"
        );
        Ok(())
    })
}

/// A counter with `env` in new pod `name` (the gpusnap handler, `annotations`), running.
fn start_with_env(
    node: &CriSigNode,
    name: &str,
    annotations: &[(&str, &str)],
    env: &[(&str, &str)],
) -> Result<Running> {
    let pod = node
        .crictl
        .run_pod(name, gpusnap_handler(), PidMode::Container, annotations)?;
    let id = node.crictl.create(
        &pod,
        "counter",
        &node.busybox,
        &["sh", "-c", COUNTER, &node.run],
        env,
    )?;
    node.crictl.start(&id)?;
    let pid = gpusnap_testkit::wait_some(Duration::from_secs(30), || {
        node.crictl.pid(&id).ok().filter(|p| *p != 0)
    })
    .with_context(|| format!("no pid for {id} in {name}"))?;
    Ok(Running { pod, id, pid })
}

#[test]
fn checkpoint_to_pushes_a_gpu_container_that_restores_with_its_device_memory() {
    check(|| {
        let gpu = GpuDouble::new(Engine::Posix, Cuda::V13_4)?;
        let base = registry_with_busybox()?;
        let busybox = base.image(BUSYBOX_REPO);
        let dest = Registry::start_with(RegistrySetup::secure())?;
        let work = tempfile::tempdir()?;
        let docker = dest.write_docker_config(&work.path().join("docker"))?;
        let ca = dest.ca_file().context("CA")?;
        let watched = checkpoint_dir(work.path())?;
        let node_a = CriSigNode::start_with_config(&base.host(), &busybox, &gpu.config())?;
        let config = format!(
            "[checkpoint]\nallowed_destinations = [\"{}/ckpt/*\"]\nregistry_config = {:?}\n\
             registry_ca_files = [{:?}]\n\n[store]\nroot = {:?}\n",
            dest.host(),
            s(&docker),
            s(&ca),
            s(&work.path().join("store")),
        );
        let agent = NodeAgent::start(
            &AgentSetup {
                checkpoint_dir: &watched,
                config,
                node: "gpu-node-a",
                api: None,
            },
            &work.path().join("agent"),
        )?;
        let (cuda, bytes) = gpu.cuda_process("push")?;
        let (k, v) = cuda.env_pair();
        let env = [(k, v)];
        let repo = format!("{}/ckpt/gpu", dest.host());
        let w = start_with_env(&node_a, "gpu", &[("gpusnap.io/checkpoint-to", &repo)], &env)?;
        wait_count(&node_a.run, "gpu", WARM, || count_of(w.pid))?;
        let name = kubelet_name("gpu");
        let checkpointed = node_a.checkpoint(&w, &watched.join(&name))?;
        gpu.check_checkpoint_calls(&cuda, w.pid, true)?;
        let rec = agent.wait_state(&name, "pushed", PUSHED_WITHIN)?;
        ensure!(rec["signed"] == false, "no signing key, yet signed: {rec}");
        let latest = format!("{repo}:latest");
        ensure!(rec["references"][1] == latest.as_str(), "{rec}");

        // Node B: the image pulled by its stable tag, restored by pod annotation.
        node_a.crictl.remove_pod(&w.pod)?;
        gpu.emulate_criu_restore(&cuda)?;
        let node_b = CriSigNode::start_with_config(&base.host(), &busybox, &gpu.config())?;
        gpusnap_ok(&[
            "--config",
            s(node_b.node.config_path()),
            "image",
            "pull",
            &format!("https://{latest}"),
            "--extract",
            "ck-gpu",
            "--ca-file",
            s(&ca),
            "--registry-config",
            s(&docker),
        ])?;
        let extents = gpusnap_testkit::gpu::gpu_files(
            &node_b.node.checkpoint_root().join("ck-gpu/checkpoint"),
        );
        ensure!(
            !extents.is_empty(),
            "the pushed image carries no GPU state files"
        );
        let r = start_with_env(
            &node_b,
            "gpu-restored",
            &[("gpusnap.io/restore-from", "ck-gpu")],
            &env,
        )?;
        gpu.check_restored(&cuda, r.pid, &bytes)?;
        check_continues("gpu-restored", &checkpointed, || count_of(r.pid))?;
        Ok(())
    })
}
