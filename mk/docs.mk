# The user guide (docs/, an mdBook) and the TrainingJob reference generated into it by xtask.

## docs: build the user guide into target/book (installs the pinned mdBook once, outside the repo).
## docs-reference: regenerate docs/src/reference/trainingjob.md from the api crate.
## docs-check: build the guide, then check every relative link and anchor of it, the README,
## ARCHITECTURE.md and bench/README.md, and that the reference is fresh (external links are not fetched).
.PHONY: docs docs-reference docs-check mdbook-bin

TEST_TARGETS += docs-check

# `make test` installs mdBook in its first stage, beside the cargo build.
prepare: mdbook-bin

mdbook-bin:
	@scripts/docs/mdbook.sh >/dev/null

docs:
	@"$$(scripts/docs/mdbook.sh)" build docs

docs-reference:
	$(CARGO) run -q -p xtask -- docgen

# mdBook fails on a chapter file that is missing; xtask's unit tests check the links and anchors and
# the reference's freshness (they run in test-cluster too). Selecting the workspace with the test
# features reuses the test binary `make test` already built.
docs-check: docs
	$(CARGO) test -q --workspace --features $(TEST_FEATURES) --bin xtask -- \
	  documentation_links_resolve committed_reference_matches_the_api_crate
