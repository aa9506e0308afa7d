//! The TrainingJob CRD (`crds/`) in a real API server: every invalid fixture
//! (`api/tests/fixtures/invalid/*.yaml`, first line `# expect: <message>`) is refused with its message,
//! every `examples/*.yaml` is accepted, and the immutable fields stay immutable on update.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tandem_testkit::{TestCluster, parse_manifests};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `*.yaml` in `dir` (sorted) with its text.
fn yaml_files(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            Ok((p, text))
        })
        .collect()
}

/// The one TrainingJob in a file.
fn job(path: &Path, text: &str) -> Result<Value> {
    let mut manifests = parse_manifests(text, &path.display().to_string())?;
    ensure!(manifests.len() == 1, "{} should hold one manifest, holds {}", path.display(), manifests.len());
    Ok(manifests.remove(0))
}

async fn cluster_with_crds() -> Result<TestCluster> {
    let cluster = TestCluster::connect().await?;
    cluster.install_crds(workspace().join("crds")).await?;
    Ok(cluster)
}

#[tokio::test]
async fn every_invalid_fixture_is_refused_by_the_api_server_with_its_message() -> Result<()> {
    let cluster = cluster_with_crds().await?;
    let ns = cluster.namespace("cel-invalid").await?;
    let fixtures = yaml_files(&workspace().join("api/tests/fixtures/invalid"))?;
    ensure!(fixtures.len() >= 8, "expected at least 8 invalid fixtures, found {}", fixtures.len());
    let mut wrong = Vec::new();
    for (path, text) in &fixtures {
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .with_context(|| format!("{} must start with `# expect: <message>`", path.display()))?
            .trim();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match cluster.create(ns.name(), &job(path, text)?).await {
            Ok(_) => wrong.push(format!("{name}: accepted, expected refusal with {expected:?}")),
            Err(err) => match err.api_status() {
                Some(status) if status.code == 422 && status.message.contains(expected) => {}
                Some(status) => wrong.push(format!(
                    "{name}: refused with {} {:?}, expected 422 containing {expected:?}",
                    status.code, status.message
                )),
                None => bail!("{name}: the request failed before the server judged it: {err}"),
            },
        }
    }
    ns.cleanup().await?;
    ensure!(
        wrong.is_empty(),
        "{} of {} fixtures misjudged:\n{}",
        wrong.len(),
        fixtures.len(),
        wrong.join("\n")
    );
    Ok(())
}

#[tokio::test]
async fn every_example_is_accepted_by_the_api_server() -> Result<()> {
    let cluster = cluster_with_crds().await?;
    let ns = cluster.namespace("cel-examples").await?;
    let examples = yaml_files(&workspace().join("examples"))?;
    ensure!(examples.len() >= 4, "examples/ should hold the documented manifests, found {}", examples.len());
    let mut refused = Vec::new();
    for (path, text) in &examples {
        let manifest = job(path, text)?;
        match cluster.create(ns.name(), &manifest).await {
            Ok(created) => {
                // The server stored the job with its defaults applied.
                let spec = created.data.get("spec").context("created job has no spec")?;
                ensure!(
                    spec.pointer("/workers/groups").is_some(),
                    "{}: stored without defaults",
                    path.display()
                );
            }
            Err(err) => refused.push(format!("{}: {err}", path.display())),
        }
    }
    ns.cleanup().await?;
    ensure!(refused.is_empty(), "examples refused:\n{}", refused.join("\n"));
    Ok(())
}

#[tokio::test]
async fn backend_and_algorithm_cannot_change_but_groups_can() -> Result<()> {
    let cluster = cluster_with_crds().await?;
    let ns = cluster.namespace("cel-update").await?;
    let path = workspace().join("examples/mnist-hybrid.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let original = job(&path, &text)?;
    cluster.apply(ns.name(), &original).await?;

    let mut changed = original.clone();
    changed["spec"]["workers"]["backend"] = Value::from("mpi");
    let err =
        cluster.apply(ns.name(), &changed).await.err().context("changing workers.backend was accepted")?;
    let message = err.api_status().map(|s| s.message.clone()).unwrap_or_else(|| err.to_string());
    ensure!(message.contains("workers.backend cannot change"), "unexpected refusal: {message}");

    let mut changed = original.clone();
    changed["spec"]["training"]["algorithm"] = Value::from("easgd");
    let err =
        cluster.apply(ns.name(), &changed).await.err().context("changing training.algorithm was accepted")?;
    let message = err.api_status().map(|s| s.message.clone()).unwrap_or_else(|| err.to_string());
    ensure!(message.contains("training.algorithm cannot change"), "unexpected refusal: {message}");

    let mut scaled = original.clone();
    scaled["spec"]["workers"]["groups"] = Value::from(4);
    let stored = cluster.apply(ns.name(), &scaled).await?;
    ensure!(stored.data.pointer("/spec/workers/groups") == Some(&Value::from(4)), "scale not stored");
    ns.cleanup().await?;
    Ok(())
}

/// The API server evaluates the spec's rules compiled into one (`tandem_api::crd`): a job that
/// breaks rules of several objects hears of each, and an explicit `null` is a field left unset.
#[tokio::test]
async fn every_broken_rule_is_reported_and_null_fields_count_as_unset() -> Result<()> {
    let cluster = cluster_with_crds().await?;
    let ns = cluster.namespace("cel-compiled").await?;
    let broken = serde_json::json!({
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "three-faults"},
        "spec": {
            "data": {"source": "mnist5k", "tokens": "characters"},
            "model": {"kind": "resnet"},
            "training": {"algorithm": "allreduce", "steps": 10, "epochs": 1},
        },
    });
    let err =
        cluster.create(ns.name(), &broken).await.err().context("a job breaking three rules was accepted")?;
    let message = err.api_status().map(|s| s.message.clone()).unwrap_or_else(|| err.to_string());
    for expected in [
        "data.tokens says how a text is cut into tokens",
        "model kind resnet needs model.depth",
        "set exactly one of training.steps and training.epochs",
    ] {
        ensure!(message.contains(expected), "the refusal does not say {expected:?}: {message}");
    }

    let nulls = serde_json::json!({
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "null-fields"},
        "spec": {
            "data": {"source": "mnist5k", "tokens": null, "path": null},
            "model": {"kind": "mlp", "depth": null},
            "training": {"algorithm": "allreduce", "steps": 10, "epochs": null},
        },
    });
    let stored =
        cluster.create(ns.name(), &nulls).await.context("a job with null optional fields was refused")?;
    for pointer in ["/spec/data/tokens", "/spec/data/path", "/spec/model/depth", "/spec/training/epochs"] {
        ensure!(
            stored.data.pointer(pointer).is_none(),
            "{pointer} was stored: {:?}",
            stored.data.pointer(pointer)
        );
    }
    ns.cleanup().await?;
    Ok(())
}

/// The API server admits a name of exactly 48 characters (`tandem_api::MAX_NAME`) (its launcher's host
/// name `<name>-g1023-launcher` is 63 long) and refuses one more, saying the limit and why.
#[tokio::test]
async fn a_name_is_bounded_by_its_longest_pod_host_name() -> Result<()> {
    let cluster = cluster_with_crds().await?;
    let ns = cluster.namespace("cel-name").await?;
    let job = |name: String| {
        serde_json::json!({
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {"training": {"algorithm": "allreduce", "steps": 10}},
        })
    };
    let longest = "a".repeat(48);
    ensure!(longest.len() + "-g1023-launcher".len() == 63, "MAX_NAME is {}", longest.len());
    cluster.create(ns.name(), &job(longest.clone())).await.context("a name of the limit was refused")?;
    let err = cluster
        .create(ns.name(), &job(format!("{longest}b")))
        .await
        .err()
        .context("a name one character over the limit was accepted")?;
    let message = err.api_status().map(|s| s.message.clone()).unwrap_or_else(|| err.to_string());
    ensure!(message.contains("at most 48 lower-case letters"), "unexpected refusal: {message}");
    ensure!(message.contains("<name>-g1023-launcher"), "the refusal does not say why: {message}");
    ns.cleanup().await?;
    Ok(())
}
