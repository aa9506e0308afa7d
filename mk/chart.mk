# The Helm chart (charts/tandem) and the plain manifests rendered from it (deploy/operator.yaml,
# operator/rbac/clusterrole.yaml). The chart is the one source of the operator's install and RBAC.

## chart-lint: helm lint --strict, helm template with default and non-default values (each validated
## against values.schema.json by helm), rejected values, and a stale check of the rendered manifests.
## chart-manifests: re-render deploy/operator.yaml and operator/rbac/clusterrole.yaml from the chart.
.PHONY: chart-lint chart-manifests

TEST_TARGETS += chart-lint

CHART := charts/tandem
# Recursive: K8S_BIN comes from controlplane.mk, included after this file.
HELM = $(K8S_BIN)/helm
# Non-default values that switch on every optional template.
CHART_ALT_VALUES = --set replicaCount=2 --set podDisruptionBudget.enabled=true \
  --set metrics.serviceMonitor.enabled=true --set watchNamespace=ml --set logFormat=text \
  --set image.tag=dev --set nodeSelector.pool=system --set tolerations[0].key=dedicated \
  --set tolerations[0].operator=Exists --set serviceAccount.name=custom \
  --set networkPolicy.enabled=true --set metrics.podMonitor.enabled=true --set metrics.dashboard.enabled=true \
  --set kueue.enabled=true

chart-lint: cluster-bins
	@set -euo pipefail; \
	$(HELM) lint --strict $(CHART); \
	$(HELM) lint --strict $(CHART) $(CHART_ALT_VALUES); \
	$(HELM) template tandem $(CHART) --namespace tandem-system >/dev/null; \
	$(HELM) template tandem $(CHART) --namespace tandem-system $(CHART_ALT_VALUES) >/dev/null; \
	$(HELM) template tandem $(CHART) --set leaderElection.enabled=false >/dev/null; \
	for bad in logFormat=xml replicaCount=-1 image.pullPolicy=Sometimes unknownKey=1 \
	           podSecurityContext.runAsNonRoot=false "replicaCount=2,leaderElection.enabled=false"; do \
	  if $(HELM) template tandem $(CHART) --set "$$bad" >/dev/null 2>&1; then \
	    echo "chart-lint: --set $$bad was accepted; values.schema.json or the templates must reject it" >&2; exit 1; \
	  fi; \
	done; \
	HELM=$(HELM) deploy/render.sh --check; \
	echo "chart-lint: chart lints, renders and rejects bad values; deploy/ is fresh"

chart-manifests: cluster-bins
	@HELM=$(HELM) deploy/render.sh
