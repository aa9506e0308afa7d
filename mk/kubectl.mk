# `kubectl tandem`, the kubectl plugin (kubectl/): its cluster tests join the control-plane test run.

.PHONY: kubectl-plugin install-kubectl-plugin

# Its tests run the built kubectl-tandem against the real apiserver of `make cluster-up`.
CLUSTER_TEST_PACKAGES += kubectl-tandem

# Where install-kubectl-plugin puts the binary: any folder on PATH works (kubectl finds plugins there).
PLUGIN_DIR ?= $(HOME)/.local/bin

## kubectl-plugin: build the kubectl-tandem binary (target/release/kubectl-tandem).
kubectl-plugin:
	$(CARGO) build --release -p kubectl-tandem

## install-kubectl-plugin: build it and copy it into PLUGIN_DIR (default ~/.local/bin; on PATH, `kubectl tandem` runs it).
install-kubectl-plugin: kubectl-plugin
	install -D -m 0755 target/release/kubectl-tandem $(PLUGIN_DIR)/kubectl-tandem
	@case ":$$PATH:" in *":$(PLUGIN_DIR):"*) ;; *) echo "add $(PLUGIN_DIR) to PATH so that kubectl finds the plugin";; esac
