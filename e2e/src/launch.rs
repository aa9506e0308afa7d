//! What a pod's container needs before its process starts: volumes on disk, environment, command.
//!
//! Expected flow: [`materialise_volumes`] writes the pod's ConfigMap and Secret volumes (and makes its
//! emptyDirs) under the pod's folder; [`Mounts::new`] maps each of the container's `volumeMounts` to
//! the folder of its volume; [`resolve_env`] computes the environment as a kubelet would; then
//! [`Mounts::rewrite`] is applied to every env value, command word and argument.
//!
//! Path rewriting (the one deliberate difference from a kubelet): processes run in the machine's own
//! filesystem, so a mount at `/etc/tandem` cannot exist there. Instead every env value, command word
//! and argument that *is* a mount path or starts with `<mount path>/` is rewritten to the same path
//! under the volume's folder (the longest mount path wins, so `/etc/tandem/ssh` beats `/etc/tandem`).
//! The launch contract passes every path through `TANDEM_*` variables, so `tandem` finds its files.
//! A program that hard-codes a mount path would not; read-only mounts are not enforced.
//!
//! Supported: ConfigMap and Secret volumes (items, modes, optional), emptyDir, hostPath (used as
//! is); env `value`, `valueFrom` fieldRef/secretKeyRef/configMapKeyRef, `envFrom`. Anything else
//! fails the pod with a message naming it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, KeyToPath, Pod, Secret};
use kube::{Api, Client};

/// Why a container could not be prepared; the pod fails with this message.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A referenced ConfigMap or Secret (or key) does not exist and is not optional.
    #[error("{kind} {name:?} (key {key:?}) is missing: {detail}; create it or mark the reference optional")]
    MissingSource {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Key looked up, if any.
        key: Option<String>,
        /// What the API server said.
        detail: String,
    },
    /// A volume type or env source this agent does not implement.
    #[error("tandem-node does not support {0}; run this pod on a real node")]
    Unsupported(String),
    /// A volumeMount names no volume of the pod.
    #[error("volumeMount {0:?} names no volume of the pod")]
    NoSuchVolume(String),
    /// Writing a volume failed.
    #[error("cannot write volume files under {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError + '_ {
    move |source| LaunchError::Io { path: path.to_owned(), source }
}

/// Writes every volume of `pod` under `root/<volume name>` and returns each volume's folder.
pub async fn materialise_volumes(
    client: &Client,
    pod: &Pod,
    root: &Path,
) -> Result<HashMap<String, PathBuf>, LaunchError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut dirs = HashMap::new();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
    for volume in volumes {
        let dir = root.join(&volume.name);
        if let Some(host) = &volume.host_path {
            dirs.insert(volume.name.clone(), PathBuf::from(&host.path));
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        if let Some(cm) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            match api.get_opt(&cm.name).await {
                Ok(Some(map)) => {
                    let mut files: BTreeMap<String, Vec<u8>> =
                        map.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
                    files.extend(map.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)));
                    write_files(&dir, files, cm.items.as_deref(), cm.default_mode, "ConfigMap", &cm.name)?;
                }
                Ok(None) if cm.optional == Some(true) => {}
                Ok(None) => return Err(missing("ConfigMap", &cm.name, None, "not found")),
                Err(e) => return Err(missing("ConfigMap", &cm.name, None, &e.to_string())),
            }
        } else if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            match api.get_opt(&name).await {
                Ok(Some(s)) => {
                    let mut files: BTreeMap<String, Vec<u8>> =
                        s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
                    files.extend(
                        s.string_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())),
                    );
                    write_files(&dir, files, secret.items.as_deref(), secret.default_mode, "Secret", &name)?;
                }
                Ok(None) if secret.optional == Some(true) => {}
                Ok(None) => return Err(missing("Secret", &name, None, "not found")),
                Err(e) => return Err(missing("Secret", &name, None, &e.to_string())),
            }
        } else if volume.empty_dir.is_none() {
            return Err(LaunchError::Unsupported(format!(
                "volume {:?} of this type (only configMap, secret, emptyDir and hostPath)",
                volume.name
            )));
        }
        dirs.insert(volume.name.clone(), dir);
    }
    Ok(dirs)
}

fn missing(kind: &'static str, name: &str, key: Option<&str>, detail: &str) -> LaunchError {
    LaunchError::MissingSource {
        kind,
        name: name.to_owned(),
        key: key.map(str::to_owned),
        detail: detail.to_owned(),
    }
}

/// Writes `files` (or the `items` subset, under their paths) with the volume's modes.
fn write_files(
    dir: &Path,
    files: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    kind: &'static str,
    name: &str,
) -> Result<(), LaunchError> {
    // A kubelet's default mode of projected files.
    let default_mode = default_mode.unwrap_or(0o644);
    let chosen: Vec<(String, String, i32)> = match items {
        Some(items) => items
            .iter()
            .map(|item| {
                if files.contains_key(&item.key) {
                    Ok((item.key.clone(), item.path.clone(), item.mode.unwrap_or(default_mode)))
                } else {
                    Err(missing(kind, name, Some(&item.key), "the key is not in it"))
                }
            })
            .collect::<Result<_, _>>()?,
        None => files.keys().map(|k| (k.clone(), k.clone(), default_mode)).collect(),
    };
    for (key, rel, mode) in chosen {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let bytes = files.get(&key).map(Vec::as_slice).unwrap_or_default();
        std::fs::write(&path, bytes).map_err(io_err(&path))?;
        let mode = u32::try_from(mode).unwrap_or(0o644);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io_err(&path))?;
    }
    Ok(())
}

/// A container's mount paths and the folders that stand in for them.
#[derive(Clone, Debug, Default)]
pub struct Mounts {
    /// (mount path, host folder), longest mount path first.
    entries: Vec<(String, PathBuf)>,
}

impl Mounts {
    /// Maps each of `container`'s volumeMounts (with its subPath) to its volume's folder in `volumes`.
    pub fn new(container: &Container, volumes: &HashMap<String, PathBuf>) -> Result<Self, LaunchError> {
        let mut entries = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            let Some(dir) = volumes.get(&mount.name) else {
                return Err(LaunchError::NoSuchVolume(mount.name.clone()));
            };
            let dir = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => dir.join(sub),
                None => dir.clone(),
            };
            entries.push((mount.mount_path.trim_end_matches('/').to_owned(), dir));
        }
        entries.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        Ok(Self { entries })
    }

    /// `value` with a leading mount path replaced by its folder; other values unchanged.
    pub fn rewrite(&self, value: &str) -> String {
        for (mount, dir) in &self.entries {
            if value == mount {
                return dir.display().to_string();
            }
            if let Some(rest) = value.strip_prefix(mount.as_str())
                && rest.starts_with('/')
            {
                return format!("{}{rest}", dir.display());
            }
        }
        value.to_owned()
    }
}

/// Facts about the pod that `fieldRef`s read.
#[derive(Clone, Debug)]
pub struct PodFacts {
    /// The pod's IP.
    pub pod_ip: String,
    /// The node's IP.
    pub host_ip: String,
    /// The node's name.
    pub node_name: String,
}

/// The container's environment, in order, as a kubelet resolves it (`envFrom` first, then `env`).
pub async fn resolve_env(
    client: &Client,
    pod: &Pod,
    container: &Container,
    facts: &PodFacts,
) -> Result<Vec<(String, String)>, LaunchError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut sources = Sources { client, ns: &ns, config_maps: HashMap::new(), secrets: HashMap::new() };
    let mut vars: Vec<(String, String)> = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(cm) = &from.config_map_ref {
            sources.config_map(&cm.name, cm.optional == Some(true)).await?
        } else if let Some(s) = &from.secret_ref {
            sources.secret(&s.name, s.optional == Some(true)).await?
        } else {
            BTreeMap::new()
        };
        vars.extend(data.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (_, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    Some(field_value(pod, &field.field_path, facts)?)
                } else if let Some(key) = &from.config_map_key_ref {
                    let data = sources.config_map(&key.name, key.optional == Some(true)).await?;
                    lookup_key(&data, "ConfigMap", &key.name, &key.key, key.optional == Some(true))?
                } else if let Some(key) = &from.secret_key_ref {
                    let data = sources.secret(&key.name, key.optional == Some(true)).await?;
                    lookup_key(&data, "Secret", &key.name, &key.key, key.optional == Some(true))?
                } else {
                    return Err(LaunchError::Unsupported(format!(
                        "the valueFrom source of env {}",
                        var.name
                    )));
                }
            }
            (Some(value), None) => Some(value.clone()),
            (None, None) => Some(String::new()),
        };
        if let Some(value) = value {
            vars.retain(|(k, _)| k != &var.name);
            vars.push((var.name.clone(), value));
        }
    }
    Ok(vars)
}

fn lookup_key(
    data: &BTreeMap<String, String>,
    kind: &'static str,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, LaunchError> {
    match data.get(key) {
        Some(v) => Ok(Some(v.clone())),
        None if optional => Ok(None),
        None => Err(missing(kind, name, Some(key), "the key is not in it")),
    }
}

fn field_value(pod: &Pod, path: &str, facts: &PodFacts) -> Result<String, LaunchError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let from_map = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => Some(facts.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => Some(facts.pod_ip.clone()),
        "status.hostIP" | "status.hostIPs" => Some(facts.host_ip.clone()),
        _ => from_map(&meta.labels, "metadata.labels['")
            .or_else(|| from_map(&meta.annotations, "metadata.annotations['"))
            .map(Some)
            .ok_or_else(|| LaunchError::Unsupported(format!("fieldRef {path}")))?,
    };
    Ok(value.unwrap_or_default())
}

/// ConfigMaps and Secrets read once per container.
struct Sources<'a> {
    client: &'a Client,
    ns: &'a str,
    config_maps: HashMap<String, Option<BTreeMap<String, String>>>,
    secrets: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl Sources<'_> {
    async fn config_map(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, String>, LaunchError> {
        if !self.config_maps.contains_key(name) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.ns);
            let got =
                api.get_opt(name).await.map_err(|e| missing("ConfigMap", name, None, &e.to_string()))?;
            self.config_maps.insert(name.to_owned(), got.map(|c| c.data.unwrap_or_default()));
        }
        match self.config_maps.get(name).cloned().flatten() {
            Some(data) => Ok(data),
            None if optional => Ok(BTreeMap::new()),
            None => Err(missing("ConfigMap", name, None, "not found")),
        }
    }

    async fn secret(&mut self, name: &str, optional: bool) -> Result<BTreeMap<String, String>, LaunchError> {
        if !self.secrets.contains_key(name) {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), self.ns);
            let got = api.get_opt(name).await.map_err(|e| missing("Secret", name, None, &e.to_string()))?;
            let data = got.map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            });
            self.secrets.insert(name.to_owned(), data);
        }
        match self.secrets.get(name).cloned().flatten() {
            Some(data) => Ok(data),
            None if optional => Ok(BTreeMap::new()),
            None => Err(missing("Secret", name, None, "not found")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::VolumeMount;

    use super::*;

    fn mount(name: &str, path: &str, sub: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            sub_path: sub.map(Into::into),
            ..VolumeMount::default()
        }
    }

    #[test]
    fn mount_paths_are_rewritten_longest_first_and_only_on_path_boundaries() {
        let container = Container {
            volume_mounts: Some(vec![
                mount("config", "/etc/tandem", None),
                mount("ssh", "/etc/tandem/ssh/", None),
                mount("out", "/var/lib/tandem", Some("run1")),
            ]),
            ..Container::default()
        };
        let volumes = HashMap::from([
            ("config".to_owned(), PathBuf::from("/tmp/p/config")),
            ("ssh".to_owned(), PathBuf::from("/tmp/p/ssh")),
            ("out".to_owned(), PathBuf::from("/tmp/p/out")),
        ]);
        let mounts = Mounts::new(&container, &volumes).unwrap();
        assert_eq!(mounts.rewrite("/etc/tandem/job.json"), "/tmp/p/config/job.json");
        assert_eq!(mounts.rewrite("/etc/tandem/ssh/id"), "/tmp/p/ssh/id");
        assert_eq!(mounts.rewrite("/etc/tandem"), "/tmp/p/config");
        assert_eq!(mounts.rewrite("/var/lib/tandem"), "/tmp/p/out/run1");
        assert_eq!(mounts.rewrite("/etc/tandemx/a"), "/etc/tandemx/a");
        assert_eq!(mounts.rewrite("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn a_mount_of_a_missing_volume_is_an_error() {
        let container =
            Container { volume_mounts: Some(vec![mount("x", "/x", None)]), ..Container::default() };
        assert!(
            matches!(Mounts::new(&container, &HashMap::new()), Err(LaunchError::NoSuchVolume(v)) if v == "x")
        );
    }

    #[test]
    fn items_select_keys_paths_and_modes() {
        let dir = std::env::temp_dir().join(format!("tandem-launch-test-{}", std::process::id()));
        let files = BTreeMap::from([("a".to_owned(), b"A".to_vec()), ("b".to_owned(), b"B".to_vec())]);
        let items = [KeyToPath { key: "b".into(), path: "sub/b.txt".into(), mode: Some(0o400) }];
        write_files(&dir, files.clone(), Some(&items), None, "Secret", "s").unwrap();
        assert_eq!(std::fs::read(dir.join("sub/b.txt")).unwrap(), b"B");
        assert!(!dir.join("a").exists());
        let mode = std::fs::metadata(dir.join("sub/b.txt")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let bad = [KeyToPath { key: "c".into(), path: "c".into(), mode: None }];
        assert!(write_files(&dir, files, Some(&bad), None, "Secret", "s").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
