# jobplane: `make demo` runs the whole lifecycle locally; `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov's own venv (see `checkov:` below)
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE :=

.PHONY: test check lint typecheck docs checkov pytest pytest-check demo local-images local-index

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[aws,gcp,cdk,dev,docs,examples,plot,ui]'
	@# the repo's bytecode, as pip compiles the packages it installs: else four test workers compile it at once
	$(BIN)/python -m compileall -q -j 0 app.py functions infra shared tests > /dev/null
	@# and pytest's assertion-rewritten test modules (a pyc of their own): else each of the four workers rewrites them all
	$(BIN)/python -m pytest --collect-only -q -p no:cacheprovider > /dev/null
	touch $@

# The static checks run beside pytest, whose tests mostly wait (on local clouds, servers, subprocesses). What they
# need installed or built comes first: the venvs, the local cloud's images, the CDK assets. checkov runs inside
# pytest (tests/infra/test_checkov.py), over the template the infra tests synthesize: one synth less than `checkov:`.
test: $(STAMP) $(CHECKOV_STAMP) local-images cdk-assets stack-iam
	$(MAKE) --no-print-directory --output-sync=line -j4 lint typecheck docs pytest

# The loop while working, under a minute: ruff, mypy and the check tier (the pure tests and the days on the manual
# clock: every decision, reconcile rule, spec and record test; tests/budgets.json says which units those are).
check: $(STAMP)
	$(MAKE) --no-print-directory --output-sync=line -j3 lint typecheck pytest-check

pytest-check: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadscope --tier check -q

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy's cache lives beside the local cloud's builds (jobplane.local.cache_dir), shared by every clone on the machine:
# it checks each module's hash, so a new clone re-checks only what differs (0.5 s, not 13 CPU s cold).
MYPY_CACHE ?= $(or $(JOBPLANE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/jobplane)/mypy
typecheck: $(STAMP)
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)

# The docs/ site (mkdocs.yml): --strict fails on a broken link or a page missing from the nav.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

# checkov, a scanner we did not write, over the synthesized AWS template (as `make synth` writes it, here into
# build/checkov/, its assets left unstaged: checkov reads the template only) and the GCP Terraform: a failing check not accepted, with its reason, in infra/checkov-skips.yaml
# fails the build (infra/checkov_gate.py). checkov runs from a venv of its own (infra/checkov-requirements.txt says
# why), installed from PyPI on the first run.
$(CHECKOV_STAMP): infra/checkov-requirements.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r infra/checkov-requirements.txt
	touch $@

checkov: $(STAMP) $(CHECKOV_STAMP)
	rm -rf build/checkov
	CDK_OUTDIR=build/checkov/cdk.out CDK_CONTEXT_JSON='{"aws:cdk:disable-asset-staging": true}' $(CDK_APP) > /dev/null
	$(BIN)/python -m infra.checkov_gate --checkov $(CHECKOV_VENV)/bin/checkov \
	  --template build/checkov/cdk.out/Jobplane.template.json --terraform infra/gcp

# Four workers (tests/scheduling.py): most tests wait, so they overlap well even on two cores. Five were 15 s faster
# on a quiet 2-core machine, but kept both CPUs so busy that an agent's checkpoint copies fell behind a job saving
# every second (test_checkpoint_habits failed once); six were slower. The run ends with the costliest units, their
# seconds and CPU seconds beside their budgets (tests/budgets.json).
PYTEST_ARGS ?= -n 4 --dist loadscope
pytest: $(STAMP) local-images chromium
	$(BIN)/pytest $(PYTEST_ARGS)

# The local cloud's stock Debian 12 image (debootstrap, python3 only), its Debian 12 + podman image (the stock one
# plus Debian's podman), the OCI image of the stock one its container registry serves (jobplane/debian:12), and
# the wheels its package index serves its jobs' requirements.txt from (numpy, pip, setuptools, wheel), cached in
# ~/.cache/jobplane outside the repo: a few minutes the first time, from Debian's mirror and PyPI. Never fails the
# build: the scenario tests that need them skip, saying why.
local-images: local-index
	$(BIN)/python -m jobplane.local.rootfs build
	$(BIN)/python -m jobplane.local.oci_registry build

# Debian's Chromium, which tests/ui drives with Playwright (no browser download): installed when missing, as root
# where apt-get exists. Never fails the build: without it the browser tests skip, saying why.
.PHONY: chromium
chromium:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
	  >/dev/null 2>&1; } || echo "no /usr/bin/chromium (not root, no apt-get, or the install failed): tests/ui's browser tests skip"

# The CDK stack's Lambda asset and agent bundles (and the PyPI wheels they are built from), cached by their inputs in
# ~/.cache/jobplane/cdk-assets: the first time needs PyPI; afterwards a change to jobplane only repacks them.
.PHONY: cdk-assets
cdk-assets: $(STAMP)
	$(BIN)/python -m infra.aws.bundle

local-index: $(STAMP)
	$(BIN)/python -m jobplane.local.package_index fill

# The functions' roles as `cdk synth` defines them, which the local AWS cloud runs each function under
# (jobplane.local.stack_iam), exported once per digest of their inputs into ~/.cache/jobplane/stack-iam: a synth
# (about 10 CPU s) here, never at a local cloud's start. Never fails the build: a cloud that finds none exports it.
.PHONY: stack-iam
stack-iam: $(STAMP)
	$(BIN)/python -m jobplane.local.stack_iam build

# `make demo` runs the lifecycle on the local AWS cloud, `make demo CLOUD=gcp` on the local GCP one.
CLOUD ?= aws
demo: $(STAMP) local-index
	$(BIN)/jobplane validate examples/*.yaml examples/gcp/*.yaml
	$(BIN)/python -m jobplane.local.demo --cloud $(CLOUD)

# GCP: the Cloud Functions source zip (main.py + the jobplane package as shipped on GCP + requirements.txt at its
# root, infra/gcp/bundle.py) and
# the agent bundles the VMs boot from system/agent/ (one per VM Python and architecture, from PyPI; add
# Pythons with VM_PYTHONS="3.13"); infra/gcp/README.md deploys them with terraform.
VM_PYTHONS ?=
.PHONY: gcp-package gcp-functions-zip
gcp-package: gcp-functions-zip
	rm -rf build/agent
	$(BIN)/python -m jobplane.boot.bundling --cloud gcp --out build/agent $(foreach v,$(VM_PYTHONS),--python $(v))
	@echo "built build/gcp-functions.zip and build/agent/"

gcp-functions-zip: $(STAMP)
	$(BIN)/python -m infra.gcp.bundle build/gcp-functions.zip

# AWS: `make synth` builds the Lambda bundle and the agent bundles (cached in ~/.cache/jobplane/cdk-assets by a
# hash of their inputs; only the first run needs PyPI) and writes cdk.out/ with cdk-nag enforced; no npm, no credentials. `make deploy` and
# `make destroy` use the npm aws-cdk CLI through npx; pass extra flags with CDK_ARGS="-c jobplane:alarmEmail=...".
CDK ?= npx --yes aws-cdk@2
CDK_APP := $(BIN)/python app.py
.PHONY: synth deploy destroy
synth: $(STAMP)
	CDK_OUTDIR=cdk.out $(CDK_APP)
	@echo "synthesized cdk.out/Jobplane.template.json"

deploy: $(STAMP)
	$(CDK) bootstrap --app "$(CDK_APP)" $(CDK_ARGS)
	$(CDK) deploy --app "$(CDK_APP)" --require-approval broadening $(CDK_ARGS)

destroy: $(STAMP)
	$(CDK) destroy --app "$(CDK_APP)" --force $(CDK_ARGS)
