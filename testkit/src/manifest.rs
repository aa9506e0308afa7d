//! Reading Kubernetes manifests: multi-document YAML into JSON values, each checked to name its
//! `apiVersion` and `kind`, so they can be sent to the API server exactly as written.

use kube::core::GroupVersionKind;
use serde::Deserialize;
use serde_json::Value;

use crate::Error;

/// Parses every document of a (multi-document) YAML text. Empty documents (only comments or
/// whitespace, as between `---` lines) are skipped. `origin` names the text in errors (e.g. a path).
///
/// Fails when a document is not valid YAML, is not a mapping, or lacks `apiVersion` or `kind`.
pub fn parse_manifests(text: &str, origin: &str) -> Result<Vec<Value>, Error> {
    let mut manifests = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| Error::Manifest {
            origin: origin.to_owned(),
            problem: format!("document {} is not valid YAML: {e}", index + 1),
        })?;
        if value.is_null() {
            continue;
        }
        if !value.is_object() {
            return Err(Error::Manifest {
                origin: origin.to_owned(),
                problem: format!("document {} is not a mapping (a Kubernetes object)", index + 1),
            });
        }
        group_version_kind(&value, origin)?;
        manifests.push(value);
    }
    Ok(manifests)
}

/// The group, version and kind a manifest declares.
pub(crate) fn group_version_kind(manifest: &Value, origin: &str) -> Result<GroupVersionKind, Error> {
    let field = |name: &str| {
        manifest.get(name).and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| Error::Manifest {
            origin: origin.to_owned(),
            problem: format!(
                "the object has no `{name}`; every Kubernetes manifest needs apiVersion and kind"
            ),
        })
    };
    let api_version = field("apiVersion")?;
    let kind = field("kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(GroupVersionKind::gvk(group, version, kind))
}

/// `metadata.name` of a manifest, if it has one.
pub(crate) fn name_of(manifest: &Value) -> Option<&str> {
    manifest.pointer("/metadata/name").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_document_and_skips_empty_ones() {
        let text = "# leading comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\
                    # only a comment\n---\napiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: b}\n";
        let manifests = parse_manifests(text, "inline").unwrap();
        assert_eq!(manifests.len(), 2);
        let core = group_version_kind(&manifests[0], "inline").unwrap();
        assert_eq!((core.group.as_str(), core.version.as_str(), core.kind.as_str()), ("", "v1", "ConfigMap"));
        let tj = group_version_kind(&manifests[1], "inline").unwrap();
        assert_eq!((tj.group.as_str(), tj.version.as_str()), ("tandem.dev", "v1alpha1"));
        assert_eq!(name_of(&manifests[1]), Some("b"));
    }

    #[test]
    fn a_manifest_without_kind_is_refused_with_its_origin() {
        let err = parse_manifests("apiVersion: v1\nmetadata: {name: a}\n", "job.yaml").unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("job.yaml:"), "{message}");
        assert!(message.contains("no `kind`"), "{message}");
    }

    #[test]
    fn broken_yaml_and_scalars_are_refused() {
        let err = parse_manifests("apiVersion: v1\nkind: [unclosed\n", "bad.yaml").unwrap_err();
        assert!(err.to_string().contains("document 1 is not valid YAML"), "{err}");
        let err = parse_manifests("just a string\n", "scalar.yaml").unwrap_err();
        assert!(err.to_string().contains("not a mapping"), "{err}");
    }
}
