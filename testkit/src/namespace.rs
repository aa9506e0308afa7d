//! A namespace that lives for one test.
//!
//! Guarantees: the namespace is deleted when [`TestNamespace::cleanup`] is called (which waits until the
//! namespace controller has removed it and everything in it) or, without waiting, when the value is
//! dropped — also while a failing test unwinds. Namespaces that still leak (the process was killed)
//! carry the label [`crate::TESTKIT_LABEL`] and vanish with the control plane at `make cluster-down`.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};
use kube::{Client, Config};

use crate::{Error, WAIT_TIMEOUT};

/// A namespace created by [`crate::TestCluster::namespace`] for one test.
pub struct TestNamespace {
    name: String,
    config: Config,
    client: Client,
    deleted: bool,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace").field("name", &self.name).finish()
    }
}

/// 8 characters of [a-z0-9] that differ between calls, processes and runs.
pub(crate) fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded randomly per process; the counter and pid separate calls and processes.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let mut bits = hasher.finish();
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..8)
        .map(|_| {
            let c = alphabet[(bits % 36) as usize] as char;
            bits /= 36;
            c
        })
        .collect()
}

impl TestNamespace {
    pub(crate) fn new(name: String, config: Config, client: Client) -> Self {
        Self { name, config, client, deleted: false }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin client, for requests in this namespace.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A typed API for namespaced resources in this namespace, as admin.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace and waits until the namespace controller has removed it with everything in
    /// it. Fails with [`Error::Timeout`] — naming what still holds it — when that takes longer than
    /// [`crate::WAIT_TIMEOUT`], typically because an object inside keeps a finalizer nobody removes.
    pub async fn cleanup(mut self) -> Result<(), Error> {
        self.deleted = true;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let action = || format!("delete namespace {}", self.name);
        match api.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(source) => return Err(Error::Api { action: action(), source }),
        }
        let deadline = tokio::time::Instant::now() + WAIT_TIMEOUT;
        loop {
            let namespace = match api.get_opt(&self.name).await {
                Ok(None) => return Ok(()),
                Ok(Some(namespace)) => namespace,
                Err(source) => return Err(Error::Api { action: format!("watch {} go", action()), source }),
            };
            if tokio::time::Instant::now() > deadline {
                let conditions = namespace
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| c.status == "True")
                    .map(|c| format!("{}: {}", c.type_, c.message.unwrap_or_default()))
                    .collect::<Vec<_>>();
                return Err(Error::Timeout {
                    what: format!("namespace {} to be removed (still there; {conditions:?})", self.name),
                    seconds: WAIT_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

impl Drop for TestNamespace {
    /// Best-effort delete without waiting. The test's runtime may be shutting down (or be a
    /// current-thread runtime blocked right here), so the request runs on a thread with its own
    /// runtime and its own client.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let (name, config) = (self.name.clone(), self.config.clone());
        let deleter = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let client = Client::try_from(config).map_err(|e| e.to_string())?;
                match Api::<Namespace>::all(client).delete(&name, &DeleteParams::background()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            })
        });
        match deleter.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("tandem-testkit: could not delete namespace {}: {e}", self.name),
            Err(_) => eprintln!("tandem-testkit: the thread deleting namespace {} panicked", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_short_lowercase_and_distinct() {
        let suffixes: std::collections::BTreeSet<String> = (0..1000).map(|_| random_suffix()).collect();
        assert_eq!(suffixes.len(), 1000);
        assert!(
            suffixes
                .iter()
                .all(|s| s.len() == 8 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        );
    }
}
