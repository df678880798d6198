# jobplane: `make demo` runs the whole lifecycle locally; `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE :=

.PHONY: test lint typecheck pytest demo local-images local-index

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[aws,gcp,cdk,dev,examples,plot]'
	touch $@

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) local-images
	$(BIN)/pytest

# The local cloud's stock Debian 12 image (debootstrap, python3 only) and the wheels its package index serves
# its jobs' requirements.txt from (numpy, pip, setuptools, wheel), cached in ~/.cache/jobplane outside the repo:
# a few minutes the first time, from Debian's mirror and PyPI. Never fails the build: the scenario tests that
# need them skip, saying why.
local-images: local-index
	$(BIN)/python -m jobplane.local.rootfs build

local-index: $(STAMP)
	$(BIN)/python -m jobplane.local.package_index fill

demo: $(STAMP) local-index
	$(BIN)/jobplane validate examples/*.yaml
	$(BIN)/python -m jobplane.local.demo

# GCP: the Cloud Functions source zip (main.py + the jobplane package + requirements.txt at its root) and
# the agent bundles the VMs boot from system/agent/ (one per VM Python and architecture, from PyPI; add
# Pythons with VM_PYTHONS="3.13"); infra/gcp/README.md deploys them with terraform.
GCP_BUILD := build/gcp-functions
VM_PYTHONS ?=
.PHONY: gcp-package gcp-functions-zip
gcp-package: gcp-functions-zip
	rm -rf build/agent
	$(BIN)/python -m jobplane.bundling --cloud gcp --out build/agent $(foreach v,$(VM_PYTHONS),--python $(v))
	@echo "built build/gcp-functions.zip and build/agent/"

gcp-functions-zip: $(STAMP)
	rm -rf $(GCP_BUILD) build/gcp-functions.zip && mkdir -p $(GCP_BUILD)/jobplane
	cp functions/gcp/main.py infra/gcp/requirements.txt $(GCP_BUILD)/
	cp -R shared/jobplane/. $(GCP_BUILD)/jobplane/
	find $(GCP_BUILD) -name __pycache__ -prune -exec rm -rf {} +
	cd $(GCP_BUILD) && ../../$(BIN)/python -m zipfile -c ../gcp-functions.zip main.py requirements.txt jobplane

# AWS: `make synth` builds the Lambda bundle and the agent bundles (cached in build/cdk-assets; only the first
# run needs PyPI) and writes cdk.out/ with cdk-nag enforced; no npm, no credentials. `make deploy` and
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
