//! The connection to the test control plane: the admin client from `KUBECONFIG`, impersonated clients,
//! temporary namespaces, CRD installation and sending manifests as written.
//!
//! Guarantees: [`TestCluster::connect`] only succeeds once the API server has answered; CRDs returned
//! by [`TestCluster::install_crds`] are Established and their resources can be listed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use serde_json::Value;

use crate::manifest::{group_version_kind, name_of, parse_manifests};
use crate::{Error, FIELD_MANAGER, TESTKIT_LABEL, TestNamespace, WAIT_TIMEOUT};

/// A connection, as cluster admin, to the control plane named by `KUBECONFIG`.
#[derive(Clone)]
pub struct TestCluster {
    config: Config,
    client: Client,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster").field("server", &self.config.cluster_url.to_string()).finish()
    }
}

/// The kubeconfig path from the value of `KUBECONFIG`: its first entry, as kubectl reads a list.
fn kubeconfig_path(value: Option<OsString>) -> Result<PathBuf, Error> {
    let value = value.filter(|v| !v.is_empty()).ok_or(Error::KubeconfigUnset)?;
    std::env::split_paths(&value).find(|p| !p.as_os_str().is_empty()).ok_or(Error::KubeconfigUnset)
}

impl TestCluster {
    /// Connects through the kubeconfig named by `KUBECONFIG` and checks that the API server answers.
    ///
    /// Fails with [`Error::KubeconfigUnset`] when `KUBECONFIG` is unset or empty, and with
    /// [`Error::Unreachable`] when the server does not answer.
    pub async fn connect() -> Result<Self, Error> {
        let path = kubeconfig_path(std::env::var_os("KUBECONFIG"))?;
        Self::connect_with_kubeconfig(&path).await
    }

    /// Connects through the given kubeconfig file (its current context).
    pub async fn connect_with_kubeconfig(path: &Path) -> Result<Self, Error> {
        let kubeconfig_error = |source| Error::Kubeconfig { path: path.to_owned(), source };
        let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(kubeconfig_error)?;
        let client = Client::try_from(config.clone()).map_err(Error::Client)?;
        client
            .apiserver_version()
            .await
            .map_err(|source| Error::Unreachable { server: config.cluster_url.to_string(), source })?;
        Ok(Self { config, client })
    }

    /// The admin client (group `system:masters`: every request is allowed).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin client's configuration, e.g. to build a client with other settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A client that acts as the ServiceAccount `sa_name` in `sa_namespace`: the API server sees the user
    /// `system:serviceaccount:<sa_namespace>:<sa_name>` in the groups `system:serviceaccounts`,
    /// `system:serviceaccounts:<sa_namespace>` and `system:authenticated`, and authorizes each request
    /// with RBAC exactly as for the real ServiceAccount. The ServiceAccount need not exist.
    pub fn impersonate(&self, sa_namespace: &str, sa_name: &str) -> Result<Client, Error> {
        self.impersonate_user(&format!("system:serviceaccount:{sa_namespace}:{sa_name}"), &[])
    }

    /// A client that acts as any user, in the given groups (none: the API server adds the groups it
    /// knows for ServiceAccount users, and `system:authenticated`).
    pub fn impersonate_user(&self, user: &str, groups: &[&str]) -> Result<Client, Error> {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups =
            (!groups.is_empty()).then(|| groups.iter().map(|g| (*g).to_owned()).collect());
        Client::try_from(config).map_err(Error::Client)
    }

    /// Creates a namespace named `<prefix>-<8 random characters>` for one test. Delete it with
    /// [`TestNamespace::cleanup`]; dropping it deletes it too, without waiting.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace, Error> {
        validate_prefix(prefix)?;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let mut attempt = 0;
        loop {
            let name = format!("{prefix}-{}", crate::namespace::random_suffix());
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some([(TESTKIT_LABEL.to_owned(), "true".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match api.create(&PostParams::default(), &namespace).await {
                Ok(_) => return Ok(TestNamespace::new(name, self.config.clone(), self.client.clone())),
                // A name clash with a namespace still being deleted: draw another name.
                Err(kube::Error::Api(status)) if status.code == 409 && attempt < 3 => attempt += 1,
                Err(source) => return Err(Error::Api { action: format!("create namespace {name}"), source }),
            }
        }
    }

    /// Server-side applies every CustomResourceDefinition in the `*.yaml`/`*.yml` files of `dir` (other
    /// kinds in those files are an error) and waits until each is Established and its resources can be
    /// listed. Returns the CRDs as the server holds them. Applying again is harmless.
    pub async fn install_crds(&self, dir: impl AsRef<Path>) -> Result<Vec<CustomResourceDefinition>, Error> {
        let dir = dir.as_ref();
        let read_error = |source| Error::Read { path: dir.to_owned(), source };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(read_error)? {
            let path = entry.map_err(read_error)?.path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
        files.sort();
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut installed = Vec::new();
        for file in files {
            let origin = file.display().to_string();
            let text = std::fs::read_to_string(&file)
                .map_err(|source| Error::Read { path: file.clone(), source })?;
            for manifest in parse_manifests(&text, &origin)? {
                let gvk = group_version_kind(&manifest, &origin)?;
                if gvk.group != "apiextensions.k8s.io" || gvk.kind != "CustomResourceDefinition" {
                    return Err(Error::Manifest {
                        origin,
                        problem: format!(
                            "holds a {}, not a CustomResourceDefinition; keep only CRDs in the folder",
                            gvk.kind
                        ),
                    });
                }
                let name = name_of(&manifest).ok_or_else(|| Error::Manifest {
                    origin: origin.clone(),
                    problem: "a CustomResourceDefinition without metadata.name".to_owned(),
                })?;
                let crd = api
                    .patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&manifest))
                    .await
                    .map_err(|source| Error::Api {
                        action: format!("apply CRD {name} from {origin}"),
                        source,
                    })?;
                installed.push(crd);
            }
        }
        if installed.is_empty() {
            return Err(Error::NoCrds(dir.to_owned()));
        }
        let mut established = Vec::with_capacity(installed.len());
        for crd in installed {
            established.push(self.wait_established(&api, crd).await?);
        }
        Ok(established)
    }

    /// Waits until the CRD is Established and each served version answers a list.
    async fn wait_established(
        &self,
        api: &Api<CustomResourceDefinition>,
        crd: CustomResourceDefinition,
    ) -> Result<CustomResourceDefinition, Error> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let timeout = |what: String| Error::Timeout { what, seconds: WAIT_TIMEOUT.as_secs() };
        let crd = match tokio::time::timeout(
            WAIT_TIMEOUT,
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        {
            Err(_) => return Err(timeout(format!("CRD {name} to become Established"))),
            Ok(Err(e)) => {
                return Err(Error::Manifest {
                    origin: format!("CRD {name}"),
                    problem: format!("watch failed: {e}"),
                });
            }
            Ok(Ok(Some(crd))) => crd,
            Ok(Ok(None)) => {
                return Err(Error::Manifest {
                    origin: format!("CRD {name}"),
                    problem: "was deleted while waiting for it to become Established".to_owned(),
                });
            }
        };
        let deadline = tokio::time::Instant::now() + WAIT_TIMEOUT;
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            let objects: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
            while let Err(e) = objects.list(&ListParams::default().limit(1)).await {
                if tokio::time::Instant::now() > deadline {
                    return Err(timeout(format!("{} {} to be served (last error: {e})", name, version.name)));
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
        Ok(crd)
    }

    /// Creates one manifest as written (parse it with [`crate::parse_manifests`]), in `namespace` when its
    /// kind is namespaced. The API server's own checks — schema, CEL rules, admission, RBAC — decide; a
    /// refusal is an [`Error::Api`] whose [`Error::api_status`] carries the server's message.
    pub async fn create(&self, namespace: &str, manifest: &Value) -> Result<DynamicObject, Error> {
        self.create_as(&self.client, namespace, manifest).await
    }

    /// [`TestCluster::create`] through another client, e.g. one from [`TestCluster::impersonate`].
    pub async fn create_as(
        &self,
        client: &Client,
        namespace: &str,
        manifest: &Value,
    ) -> Result<DynamicObject, Error> {
        let (api, object, description) = self.prepare(client, namespace, manifest).await?;
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|source| Error::Api { action: format!("create {description}"), source })
    }

    /// Server-side applies one manifest (field manager [`crate::FIELD_MANAGER`], forced), in `namespace`
    /// when its kind is namespaced.
    pub async fn apply(&self, namespace: &str, manifest: &Value) -> Result<DynamicObject, Error> {
        let (api, object, description) = self.prepare(&self.client, namespace, manifest).await?;
        let name = object.metadata.name.clone().ok_or_else(|| Error::Manifest {
            origin: description.clone(),
            problem: "server-side apply needs metadata.name".to_owned(),
        })?;
        api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object))
            .await
            .map_err(|source| Error::Api { action: format!("apply {description}"), source })
    }

    /// The API for a manifest's kind (found by discovery), the object, and words for errors.
    async fn prepare(
        &self,
        client: &Client,
        namespace: &str,
        manifest: &Value,
    ) -> Result<(Api<DynamicObject>, DynamicObject, String), Error> {
        let gvk = group_version_kind(manifest, "manifest")?;
        let description = match name_of(manifest) {
            Some(name) => format!("{} {name:?} in namespace {namespace:?}", gvk.kind),
            None => format!("{} in namespace {namespace:?}", gvk.kind),
        };
        let (resource, capabilities) =
            discovery::pinned_kind(&self.client, &gvk).await.map_err(|source| Error::Api {
                action: format!("discover the resource for {}/{}", gvk.api_version(), gvk.kind),
                source,
            })?;
        let mut object: DynamicObject = serde_json::from_value(manifest.clone()).map_err(|e| {
            Error::Manifest { origin: description.clone(), problem: format!("not a Kubernetes object: {e}") }
        })?;
        let api = match capabilities.scope {
            Scope::Namespaced => {
                object.metadata.namespace = Some(namespace.to_owned());
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        Ok((api, object, description))
    }
}

/// A prefix must leave a valid namespace name (an RFC 1123 label of at most 63 characters) after
/// `-<8 characters>` is added.
fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let invalid = |reason| Err(Error::InvalidPrefix { prefix: prefix.to_owned(), reason });
    if prefix.is_empty() {
        return invalid("it is empty");
    }
    if prefix.len() > 40 {
        return invalid("it is longer than 40 characters");
    }
    if !prefix.starts_with(|c: char| c.is_ascii_lowercase()) {
        return invalid("it does not start with a lowercase letter");
    }
    if !prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return invalid("it holds a character other than a-z, 0-9 and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_kubeconfig_says_how_to_start_the_control_plane() {
        for value in [None, Some(OsString::new())] {
            let err = kubeconfig_path(value).unwrap_err();
            assert!(matches!(err, Error::KubeconfigUnset));
            assert!(err.to_string().contains("make cluster-up"), "{err}");
        }
    }

    #[test]
    fn kubeconfig_list_uses_its_first_entry() {
        let path = kubeconfig_path(Some(OsString::from("/a/kubeconfig:/b/kubeconfig"))).unwrap();
        assert_eq!(path, PathBuf::from("/a/kubeconfig"));
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_file_is_named_in_the_error() {
        let err = TestCluster::connect_with_kubeconfig(Path::new("/nonexistent/tandem/kubeconfig"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/tandem/kubeconfig"), "{err}");
    }

    #[test]
    fn prefixes_that_cannot_start_a_namespace_name_are_refused() {
        assert!(validate_prefix("operator-e2e").is_ok());
        assert!(validate_prefix("a1").is_ok());
        for bad in ["", "Upper", "1digit", "under_score", "dot.ted", &"x".repeat(41)] {
            let err = validate_prefix(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidPrefix { .. }), "{bad:?} accepted");
        }
    }
}
