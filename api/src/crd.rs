//! The TrainingJob CRD as installed (`crds/`, the chart) and as the local runner checks it: the
//! types' generated schema with most defaults left to the readers.
//!
//! Defaults are the api crate's own (`#[serde(default)]`): the operator, the trainer and
//! `kubectl tandem` decode a job through these types and see every field filled. The API server
//! stores only the defaults that the CEL rules and the scale subresource read ([`STORED_DEFAULTS`]:
//! the data source, the model kind, the algorithm, the shape and backend of the worker groups, the
//! parameter servers' replicas and the transport), so that those rules read them as plain fields;
//! every other default stays out of the stored object, as the MPI Operator's MPIJobs do, and the
//! API server validates, stores and encodes a smaller TrainingJob on every create and status write
//! (`make bench-operator` measures the creates). A rule that reads a field outside that list guards
//! it with `has()`, and accepts its absence only where the types' default passes the rule. Each
//! default taken out is written into its field's description, so `kubectl explain` still shows it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, ValidationRule,
};
use kube::CustomResourceExt;

use crate::job::{NAME_MESSAGE, NAME_RULE, TrainingJob};

mod rules;

/// Paths (from the object's root) whose default the API server stores: the fields the CEL rules read
/// without `has()`, the objects that hold them, and `spec.workers.groups`, which the scale
/// subresource and the `Groups` column read. An object's stored default keeps only these fields.
pub const STORED_DEFAULTS: &[&str] = &[
    "spec.data",
    "spec.data.source",
    "spec.model",
    "spec.model.kind",
    "spec.network",
    "spec.network.transport",
    "spec.parameterServers",
    "spec.parameterServers.replicas",
    "spec.training.algorithm",
    "spec.workers",
    "spec.workers.backend",
    "spec.workers.groups",
    "spec.workers.groupSize",
    "spec.workers.maxGroups",
    "spec.workers.minGroups",
];

/// The CRD that `crdgen` writes into `crds/` and the chart: [`as_written`] with the spec's rules
/// compiled into one ([`rules`]), which the API server evaluates in half the time.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = as_written();
    let always: Vec<&str> = STORED_DEFAULTS.iter().filter_map(|p| p.strip_prefix("spec.")).collect();
    for version in &mut crd.spec.versions {
        if let Some(spec) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
        {
            rules::compile_spec_rules(spec, &always);
        }
    }
    crd
}

/// The CRD with each rule where the types state it, on the narrowest object that holds its fields,
/// and most defaults left to the readers: what the local runner checks a manifest against (its
/// errors name the object a rule is about), and what [`crd`] compiles.
pub fn as_written() -> CustomResourceDefinition {
    let mut crd = TrainingJob::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            unstore_defaults(schema, "");
            restrict_name(schema);
        }
    }
    crd
}

/// Gives the object's `metadata.name` the name rule ([`NAME_RULE`]). `metadata` may restrict
/// nothing but `name` and `generateName`.
fn restrict_name(root: &mut JSONSchemaProps) {
    let name = JSONSchemaProps {
        type_: Some("string".to_owned()),
        x_kubernetes_validations: Some(vec![ValidationRule {
            rule: NAME_RULE.to_owned(),
            message: Some(NAME_MESSAGE.to_owned()),
            ..ValidationRule::default()
        }]),
        ..JSONSchemaProps::default()
    };
    let metadata = JSONSchemaProps {
        type_: Some("object".to_owned()),
        properties: Some([("name".to_owned(), name)].into()),
        ..JSONSchemaProps::default()
    };
    root.properties.get_or_insert_with(Default::default).insert("metadata".to_owned(), metadata);
}

/// Moves every default under `schema` (at `path`) out of the schema, into the description of a
/// field that is not an object, except those in [`STORED_DEFAULTS`].
fn unstore_defaults(schema: &mut JSONSchemaProps, path: &str) {
    if STORED_DEFAULTS.contains(&path) {
        if let Some(serde_json::Value::Object(fields)) = schema.default.as_mut().map(|d| &mut d.0) {
            fields.retain(|name, _| STORED_DEFAULTS.contains(&format!("{path}.{name}").as_str()));
        }
    } else if let Some(default) = schema.default.take()
        && schema.type_.as_deref() != Some("object")
    {
        let shown = match &default.0 {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let text = schema.description.take().unwrap_or_default();
        let sep = if text.is_empty() || text.ends_with('.') { " " } else { ". " };
        schema.description = Some(format!("{text}{sep}Default: `{shown}`.").trim_start().to_owned());
    }
    for (name, sub) in schema.properties.iter_mut().flatten() {
        let sub_path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        unstore_defaults(sub, &sub_path);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => unstore_defaults(item, &format!("{path}[]")),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => {
            items.iter_mut().for_each(|item| unstore_defaults(item, &format!("{path}[]")))
        }
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut() {
        unstore_defaults(values, &format!("{path}{{}}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path under `schema` (at `path`) whose schema has a default, with the default.
    fn defaults(schema: &JSONSchemaProps, path: &str, out: &mut Vec<(String, serde_json::Value)>) {
        if let Some(default) = &schema.default {
            out.push((path.to_owned(), default.0.clone()));
        }
        for (name, sub) in schema.properties.iter().flatten() {
            defaults(sub, &if path.is_empty() { name.clone() } else { format!("{path}.{name}") }, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
            defaults(item, &format!("{path}[]"), out);
        }
    }

    fn root(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("a schema")
    }

    fn field<'a>(schema: &'a JSONSchemaProps, path: &str) -> &'a JSONSchemaProps {
        path.split('.').fold(schema, |s, name| &s.properties.as_ref().expect("an object")[name])
    }

    #[test]
    fn the_api_server_stores_exactly_the_listed_defaults_and_as_the_types_give_them() {
        let (generated, installed) = (TrainingJob::crd(), crd());
        let mut stored = Vec::new();
        defaults(root(&installed), "", &mut stored);
        let paths: Vec<&str> = stored.iter().map(|(p, _)| p.as_str()).collect();
        let mut listed = STORED_DEFAULTS.to_vec();
        listed.sort_unstable();
        // A listed field the types renamed or lost its default would leave a rule reading nothing.
        assert_eq!(paths, listed, "the stored defaults are not STORED_DEFAULTS");
        for (path, default) in &stored {
            let types = &field(root(&generated), path).default.as_ref().expect("the types' default").0;
            match (default, types) {
                (serde_json::Value::Object(kept), serde_json::Value::Object(all)) => {
                    for (name, value) in kept {
                        assert_eq!(Some(value), all.get(name), "{path}.{name}");
                    }
                }
                _ => assert_eq!(default, types, "{path}"),
            }
        }
    }

    #[test]
    fn a_default_left_out_is_shown_in_its_fields_description() {
        let installed = crd();
        let batch = field(root(&installed), "spec.data.batchSize");
        assert!(batch.default.is_none());
        let text = batch.description.as_deref().unwrap_or_default();
        assert!(text.ends_with("Default: `64`."), "{text}");
        assert!(field(root(&installed), "spec.runPolicy").default.is_none());
    }

    /// Every rule of an object, with where it sits (`spec.data`), over the whole schema.
    fn rules(schema: &JSONSchemaProps, path: &str, out: &mut Vec<(String, ValidationRule)>) {
        for rule in schema.x_kubernetes_validations.iter().flatten() {
            out.push((path.to_owned(), rule.clone()));
        }
        for (name, sub) in schema.properties.iter().flatten() {
            rules(sub, &if path.is_empty() { name.clone() } else { format!("{path}.{name}") }, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
            rules(item, &format!("{path}[]"), out);
        }
    }

    #[test]
    fn the_installed_crd_evaluates_every_written_rule_with_its_message() {
        let (mut written, mut installed) = (Vec::new(), Vec::new());
        rules(root(&as_written()), "", &mut written);
        let installed_crd = crd();
        rules(root(&installed_crd), "", &mut installed);
        let compiled: Vec<_> = installed.iter().filter(|(_, r)| r.message_expression.is_some()).collect();
        assert_eq!(compiled.len(), 1, "one compiled rule");
        let (at, compiled) = compiled[0];
        assert_eq!(at, "spec");
        let text = compiled.message_expression.as_deref().unwrap_or_default();
        let moved: Vec<_> = written.iter().filter(|w| !installed.contains(w)).collect();
        // The spec's own rules and those of data, model, training and workers; transition rules and
        // the rules of optional objects stay where they were written.
        assert!(moved.len() >= 40, "only {} rules compiled", moved.len());
        for (path, rule) in &moved {
            assert!(
                ["spec", "spec.data", "spec.model", "spec.training", "spec.workers"].contains(&path.as_str()),
                "{path}"
            );
            assert!(!rule.rule.contains("oldSelf"), "{path}: a transition rule moved: {}", rule.rule);
            let message = rule.message.as_deref().unwrap_or_default();
            let quoted = message.replace('\\', "\\\\").replace('\'', "\\'");
            assert!(text.contains(&quoted), "{path}: the message {message:?} is lost");
        }
        assert_eq!(installed.len(), written.len() - moved.len() + 1);
        // A field whose presence the compiled rule tests by its key is not nullable (the API server
        // prunes an explicit null, so a key present is a field set).
        let data = field(root(&installed_crd), "spec.data");
        assert!(compiled.rule.contains("'tokens' in fields.data"));
        assert_eq!(data.properties.as_ref().map(|p| p["tokens"].nullable), Some(None));
    }

    /// The name bound is derived from the schema's maxima: a change to `maxGroups`'s, `groupSize`'s
    /// or `replicas`' maximum must move [`crate::job::MAX_NAME`], and the rule and its message with it.
    #[test]
    fn the_name_rule_leaves_room_for_the_longest_child_host_name() {
        use crate::job::{
            LONGEST_CHILD_SUFFIX, MAX_GROUP_SIZE, MAX_GROUPS, MAX_HOST_NAME, MAX_NAME, MAX_PARAMETER_SERVERS,
        };
        let installed = crd();
        let max = |path: &str| field(root(&installed), path).maximum.expect("a maximum") as u32;
        for path in ["spec.workers.groups", "spec.workers.minGroups", "spec.workers.maxGroups"] {
            assert_eq!(max(path), MAX_GROUPS, "{path}");
        }
        assert_eq!(max("spec.workers.groupSize"), MAX_GROUP_SIZE);
        assert_eq!(max("spec.parameterServers.replicas"), MAX_PARAMETER_SERVERS);
        let launcher = format!("-g{}-launcher", MAX_GROUPS - 1);
        let worker = format!("-g{}-{}", MAX_GROUPS - 1, MAX_GROUP_SIZE - 1);
        let ps = format!("-ps-{}", MAX_PARAMETER_SERVERS - 1);
        assert_eq!(LONGEST_CHILD_SUFFIX, launcher.len());
        assert!(worker.len() <= LONGEST_CHILD_SUFFIX && ps.len() <= LONGEST_CHILD_SUFFIX);
        assert_eq!(MAX_NAME + LONGEST_CHILD_SUFFIX, MAX_HOST_NAME);
        assert!(NAME_RULE.starts_with(&format!("size(self) <= {MAX_NAME} ")), "{NAME_RULE}");
        assert!(NAME_MESSAGE.contains(&format!("at most {MAX_NAME} ")), "{NAME_MESSAGE}");
        assert!(NAME_MESSAGE.contains(&format!("<name>{launcher}")), "{NAME_MESSAGE}");
        assert!(NAME_MESSAGE.contains(&format!("add up to {LONGEST_CHILD_SUFFIX} more")), "{NAME_MESSAGE}");
    }
}
