//! The test kit against the real control plane (`make test-cluster`): connection, temporary namespaces
//! and their removal, ServiceAccount impersonation under RBAC, CRD installation, the controller
//! manager's garbage collection, and kwok's fake nodes running pods.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use tandem_testkit::{Error, TESTKIT_LABEL, TestCluster, parse_manifests};

/// Polls `check` every 250 ms until it returns `Some`, failing after `seconds`.
async fn eventually<T, F, Fut>(what: &str, seconds: u64, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {seconds} s waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_yaml::from_str(text).with_context(|| format!("test manifest is not valid: {text}"))
}

#[tokio::test]
async fn the_server_is_the_minor_that_k8s_openapi_is_built_for() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let info = cluster.client().apiserver_version().await?;
    assert_eq!(info.major, "1");
    // k8s-openapi's `v1_34` feature (root Cargo.toml) must match the server the tests run against.
    assert_eq!(info.minor.trim_end_matches('+'), "34", "server is {}", info.git_version);
    Ok(())
}

#[tokio::test]
async fn a_test_namespace_exists_until_cleanup_removes_it() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let ns = cluster.namespace("testkit-ns").await?;
    let name = ns.name().to_owned();
    assert!(name.starts_with("testkit-ns-") && name.len() == "testkit-ns-".len() + 8, "{name}");
    let created = namespaces.get(&name).await?;
    assert_eq!(
        created.metadata.labels.unwrap_or_default().get(TESTKIT_LABEL).map(String::as_str),
        Some("true")
    );

    // Something inside, which the namespace controller must remove with it.
    let cm: ConfigMap = yaml("metadata: {name: inside}\ndata: {k: v}")?;
    ns.api::<ConfigMap>().create(&PostParams::default(), &cm).await?;

    ns.cleanup().await?;
    assert!(namespaces.get_opt(&name).await?.is_none(), "namespace {name} still exists after cleanup");
    Ok(())
}

#[tokio::test]
async fn dropping_a_test_namespace_deletes_it() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let name = {
        let ns = cluster.namespace("testkit-drop").await?;
        ns.name().to_owned()
    };
    let ns = namespaces.get_opt(&name).await?;
    let deleting = ns.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some());
    assert!(deleting, "namespace {name} is neither gone nor terminating after drop");
    Ok(())
}

#[tokio::test]
async fn two_namespaces_with_one_prefix_get_distinct_names() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let (a, b) = (cluster.namespace("testkit-twin").await?, cluster.namespace("testkit-twin").await?);
    assert_ne!(a.name(), b.name());
    a.cleanup().await?;
    b.cleanup().await?;
    Ok(())
}

#[tokio::test]
async fn an_impersonated_service_account_has_exactly_its_rbac_rights() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let ns = cluster.namespace("testkit-rbac").await?;
    let sa = cluster.impersonate(ns.name(), "reader")?;

    // The server sees the ServiceAccount's identity and groups.
    let review = Api::<SelfSubjectReview>::all(sa.clone())
        .create(&PostParams::default(), &yaml("metadata: {}")?)
        .await?;
    let user = review.status.and_then(|s| s.user_info).context("SelfSubjectReview has no user")?;
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:reader", ns.name()).as_str())
    );
    let groups = user.groups.unwrap_or_default();
    assert!(groups.contains(&"system:serviceaccounts".to_owned()), "{groups:?}");
    assert!(!groups.contains(&"system:masters".to_owned()), "{groups:?}");

    // No rules: refused.
    let as_sa: Api<ConfigMap> = Api::namespaced(sa.clone(), ns.name());
    match as_sa.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("listing ConfigMaps without any RBAC rule was not refused: {other:?}"),
    }

    // A Role that allows reading ConfigMaps, bound to the ServiceAccount: reading works, writing does not.
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: read-configmaps}}\n\
         rules: [{{apiGroups: [''], resources: [configmaps], verbs: [get, list, watch]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: reader}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-configmaps}}\n\
         subjects: [{{kind: ServiceAccount, name: reader, namespace: {}}}]\n",
        ns.name()
    );
    for manifest in parse_manifests(&rbac, "rbac")? {
        cluster.create(ns.name(), &manifest).await?;
    }
    eventually("the RoleBinding to take effect", 30, || async {
        Ok(as_sa.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await?;
    let cm: ConfigMap = yaml("metadata: {name: written-by-reader}")?;
    match as_sa.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("creating a ConfigMap with a read-only Role was not refused: {other:?}"),
    }

    // The same refusal through the kit's create_as, with the server's status available.
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let err =
        cluster.create_as(&sa, ns.name(), &manifest).await.expect_err("read-only SA created a ConfigMap");
    assert_eq!(err.api_status().map(|s| s.code), Some(403), "{err}");
    ns.cleanup().await?;
    Ok(())
}

#[tokio::test]
async fn owned_objects_are_garbage_collected_with_their_owner() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let ns = cluster.namespace("testkit-gc").await?;
    let cms = ns.api::<ConfigMap>();
    let owner = cms.create(&PostParams::default(), &yaml("metadata: {name: owner}")?).await?;
    let uid = owner.metadata.uid.context("created ConfigMap has no uid")?;
    let child: ConfigMap = yaml(&format!(
        "metadata:\n  name: child\n  ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: owner, uid: {uid}}}]"
    ))?;
    cms.create(&PostParams::default(), &child).await?;
    cms.delete("owner", &DeleteParams::background()).await?;
    eventually("the garbage collector to delete the owned ConfigMap", 60, || async {
        Ok(cms.get_opt("child").await?.is_none().then_some(()))
    })
    .await?;
    ns.cleanup().await?;
    Ok(())
}

#[tokio::test]
async fn crds_install_and_are_served() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let crds_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds");
    let crds = cluster.install_crds(crds_dir).await?;
    let names: Vec<_> = crds.iter().filter_map(|c| c.metadata.name.clone()).collect();
    assert!(names.contains(&"trainingjobs.tandem.dev".to_owned()), "{names:?}");
    // Installing again is harmless.
    assert_eq!(cluster.install_crds(crds_dir).await?.len(), crds.len());

    let empty = std::env::temp_dir().join(format!("tandem-testkit-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty)?;
    let err = cluster.install_crds(&empty).await.expect_err("an empty folder installed CRDs");
    std::fs::remove_dir_all(&empty)?;
    assert!(matches!(err, Error::NoCrds(_)), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_pod_bound_to_a_kwok_node_runs_and_goes_away_when_deleted() -> Result<()> {
    let cluster = TestCluster::connect().await?;
    let nodes: Api<Node> = Api::all(cluster.client());
    let node_name = format!("testkit-node-{}", std::process::id());
    let node: Node = yaml(&format!(
        "metadata:\n  name: {node_name}\n  annotations: {{kwok.x-k8s.io/node: fake}}\n  labels: {{type: kwok}}\n\
         status:\n  allocatable: {{cpu: '8', memory: 16Gi, pods: '110'}}\n  capacity: {{cpu: '8', memory: 16Gi, pods: '110'}}"
    ))?;
    nodes.create(&PostParams::default(), &node).await?;
    let result = async {
        eventually("kwok to mark the fake node Ready", 60, || async {
            let node = nodes.get(&node_name).await?;
            let ready = node.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
            Ok(ready.then_some(()))
        })
        .await?;

        let ns = cluster.namespace("testkit-kwok").await?;
        let pods = ns.api::<Pod>();
        let pod: Pod = yaml(&format!(
            "metadata: {{name: sleeper}}\nspec:\n  nodeName: {node_name}\n  containers: [{{name: main, image: tandem-trainer:test}}]"
        ))?;
        pods.create(&PostParams::default(), &pod).await?;
        eventually("kwok to run the pod", 60, || async {
            let phase = pods.get("sleeper").await?.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        })
        .await?;
        pods.delete("sleeper", &DeleteParams::default()).await?;
        eventually("kwok to finish deleting the pod", 60, || async {
            Ok(pods.get_opt("sleeper").await?.is_none().then_some(()))
        })
        .await?;
        ns.cleanup().await?;
        Ok(())
    }
    .await;
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    result
}
