# jobplane on GCP: one registry bucket, six Cloud Functions (gen2), four Cloud Scheduler jobs, and
# four service accounts with the least roles each needs (custom ones for Compute Engine). Job VMs run in
# their own subnet without external IPs; the functions create and delete them.

locals {
  bucket = var.bucket_name != "" ? var.bucket_name : "${var.project}-jobplane"
  root   = trim(var.registry_root, "/")
  prefix = local.root != "" ? "${local.root}/" : ""
  env = {
    JOBPLANE_CLOUD        = "gcp"
    JOBPLANE_BUCKET       = local.bucket
    JOBPLANE_ROOT         = local.root
    JOBPLANE_REGION       = var.region
    GOOGLE_CLOUD_PROJECT  = var.project
    JOBPLANE_NOTIFY_TOPIC = google_pubsub_topic.notifications.id
    # where a job's agent asks for its job's credentials: every function that launches VMs tells them
    JOBPLANE_VEND_URL = local.vend_url
    # no pydantic plugin is used: skip the scan of every installed distribution at each cold start's first model
    PYDANTIC_DISABLE_PLUGINS = "__all__"
  }
  # The vend function's URL, known before it exists (its own env holds it: the audience of the VMs' tokens).
  vend_url = "https://${var.region}-${var.project}.cloudfunctions.net/jobplane-vend"
  # entry point => [memory, timeout seconds]; the launcher waits on insert operations.
  http_functions = {
    launcher_backstop = ["512M", 540]
    sweeper           = ["512M", 300]
    rerun             = ["512M", 540]
    uptime_cap        = ["512M", 300]
  }
  apis = ["compute", "cloudfunctions", "run", "eventarc", "cloudscheduler", "cloudbuild", "artifactregistry",
  "pubsub", "storage", "iam", "secretmanager"]

  # The deployment is its registry, bucket[/root] (Settings.deployment): every VM it launches is named
  # jobplane-<6 hex of its sha256>-<job>-a<attempt>-<rank> (clouds/gcp.py deployment_prefix), so the functions'
  # condition below reaches only this deployment's VMs, never another's in the same project.
  deployment     = local.root != "" ? "${local.bucket}/${local.root}" : local.bucket
  vm_name_prefix = "jobplane-${substr(sha256(local.deployment), 0, 6)}-"
  # every secret of this deployment (jobplane.clouds.gcp_secrets): jobplane-<tag>-<owner>_S_<name>
  secrets_prefix = "projects/${data.google_project.this.number}/secrets/jobplane-${substr(sha256(local.deployment), 0, 6)}-"

  # All a job VM's own service account may read in the registry: the agent bundles its startup script fetches
  # before the agent runs. Everything else the agent does with its job's credentials, which the vend function
  # downscopes to that job's keys (jobplane.vending.gcp).
  objects            = "projects/_/buckets/${local.bucket}/objects/${local.prefix}"
  vm_read_expression = "resource.name.startsWith('${local.objects}system/agent/')"

  # One grant per (owner, member) of var.submitters.
  submitter_grants = { for pair in flatten([
    for owner, members in var.submitters : [for member in members : { owner = owner, member = member }]
  ]) : "${pair.owner} ${pair.member}" => pair }
}

resource "google_project_service" "apis" {
  for_each           = toset(local.apis)
  service            = "${each.value}.googleapis.com"
  disable_on_destroy = false
}

# ---- storage ------------------------------------------------------------------------------------------
resource "google_storage_bucket" "registry" {
  name                        = local.bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  versioning {
    enabled = true
  }

  logging {
    log_bucket        = google_storage_bucket.access_logs.name
    log_object_prefix = "registry"
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_version_days
    }
    action {
      type = "Delete"
    }
  }
}

# The functions' source zips. Versioned, so a zip replaced under its name (its name is its content's hash: only on
# purpose) is kept for 30 days to compare with.
resource "google_storage_bucket" "sources" {
  name                        = "${local.bucket}-sources"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true

  versioning {
    enabled = true
  }

  logging {
    log_bucket        = google_storage_bucket.access_logs.name
    log_object_prefix = "sources"
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }
}

# Usage logs of the registry and the sources bucket (every request: who, what object, when; hourly files), kept a
# year, as the AWS stack keeps its server access logs. Versioned, so a log deleted before its year is up can still
# be read for 30 days. Its own requests are not logged: that would loop.
resource "google_storage_bucket" "access_logs" {
  name                        = "${local.bucket}-logs"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      age = 365
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }
}

# Cloud Storage writes usage logs as this Google group, and needs nothing more than creating them.
resource "google_storage_bucket_iam_member" "access_logs_writer" {
  bucket = google_storage_bucket.access_logs.name
  role   = "roles/storage.objectCreator"
  member = "group:cloud-storage-analytics@google.com"
}

resource "google_storage_bucket_object" "function_source" {
  # the content hash in the name makes a new zip redeploy the functions
  name   = "functions-${filemd5(var.source_zip)}.zip"
  bucket = google_storage_bucket.sources.name
  source = var.source_zip
}

# The agent bundles (one per VM Python and architecture) and their manifest: the VMs fetch them with
# python3 alone and their own service account's token (google_storage_bucket_iam_member.vms_agent_bundles).
resource "google_storage_bucket_object" "agent" {
  for_each = fileset(var.agent_dir, "*")
  name     = "${local.prefix}system/agent/${each.value}"
  bucket   = google_storage_bucket.registry.name
  source   = "${var.agent_dir}/${each.value}"
}

resource "google_storage_bucket_object" "policy" {
  name         = "${local.prefix}config/policy.yaml"
  bucket       = google_storage_bucket.registry.name
  content_type = "application/yaml"
  content = yamlencode(merge(var.policy, {
    gcp = {
      project           = var.project
      service_account   = google_service_account.vms.email
      network           = google_compute_network.jobs.id
      subnetwork        = google_compute_subnetwork.jobs.id
      default_image     = var.default_image
      default_gpu_image = var.default_gpu_image
    }
  }))
}

# ---- identities ---------------------------------------------------------------------------------------
resource "google_service_account" "functions" {
  account_id   = "jobplane-functions"
  display_name = "jobplane control functions"
}

resource "google_service_account" "vms" {
  account_id   = "jobplane-vms"
  display_name = "jobplane job VMs (agent)"
}

resource "google_service_account" "builder" {
  account_id   = "jobplane-builder"
  display_name = "jobplane function builds (Cloud Build)"
}

resource "google_service_account" "scheduler" {
  account_id   = "jobplane-scheduler"
  display_name = "jobplane Cloud Scheduler invoker (OIDC)"
}

# Functions: registry objects, VM create/delete, and attaching only the VM service account.
resource "google_storage_bucket_iam_member" "functions_registry" {
  bucket = google_storage_bucket.registry.name
  role   = "roles/storage.objectUser"
  member = google_service_account.functions.member
}

# Compute Engine: exactly the permissions of the API calls the functions make (tests/gcp/test_terraform.py
# maps every call of the adapter to them), split in two. What cannot be scoped to a VM name: a launch
# creates boot disks and uses the subnet and image; lists and operations are project-wide.
resource "google_project_iam_custom_role" "functions_compute" {
  role_id     = "jobplaneFunctionsCompute"
  title       = "jobplane functions: launch and list VMs"
  description = "Create VMs with their boot disks, read VMs and operations. Nothing that changes or deletes a VM."
  permissions = [
    "compute.instances.create",
    "compute.instances.get",
    "compute.instances.list",
    "compute.disks.create",
    "compute.disks.setLabels",
    "compute.images.useReadOnly",
    "compute.subnetworks.use",
    "compute.zoneOperations.get",
    "compute.regionOperations.get",
    "compute.globalOperations.list",
  ]
}

# What changes or deletes a VM: granted under a condition, on jobplane VMs only (below).
resource "google_project_iam_custom_role" "functions_own_vms" {
  role_id     = "jobplaneFunctionsOwnVms"
  title       = "jobplane functions: change, delete and read the console of jobplane VMs"
  description = "Delete VMs, set their labels, metadata and service account, read their serial console; granted on jobplane VMs only."
  permissions = [
    "compute.instances.delete",
    "compute.instances.getSerialPortOutput",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
  ]
}

resource "google_project_iam_member" "functions_compute" {
  project = var.project
  role    = google_project_iam_custom_role.functions_compute.name
  member  = google_service_account.functions.member
}

# On AWS, IAM itself refuses to touch an instance without the jobplane tags; here the condition keeps the
# functions off any VM not named jobplane-... (IAM conditions cannot read labels). A launch's own checks of
# setMetadata and friends pass: they are on the new jobplane-... VM, or on no instance at all.
resource "google_project_iam_member" "functions_own_vms" {
  project = var.project
  role    = google_project_iam_custom_role.functions_own_vms.name
  member  = google_service_account.functions.member
  condition {
    title       = "jobplane VMs only"
    description = "Instances whose names start with ${local.vm_name_prefix}"
    expression  = "resource.type != 'compute.googleapis.com/Instance' || resource.name.extract('/instances/{name}').startsWith('${local.vm_name_prefix}')"
  }
}

resource "google_service_account_iam_member" "functions_act_as_vms" {
  service_account_id = google_service_account.vms.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.functions.member
}

resource "google_project_iam_member" "functions_event_receiver" {
  project = var.project
  role    = "roles/eventarc.eventReceiver"
  member  = google_service_account.functions.member
}

# VMs: their own identity reads the agent bundles only (no listing: the startup script GETs by name). A job's
# agent reaches its job's keys with the credentials the vend function gives it, and no other job's.
resource "google_storage_bucket_iam_member" "vms_agent_bundles" {
  bucket = google_storage_bucket.registry.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.vms.member
  condition {
    title       = "jobplane agent bundles"
    description = "Read only system/agent/: the rest of the registry through job-scoped credentials"
    expression  = local.vm_read_expression
  }
}

# Data the jobs read (inputs: channels, code: tarballs) from buckets outside the registry: read-only.
resource "google_storage_bucket_iam_member" "vms_data" {
  for_each = toset(var.data_buckets)
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = google_service_account.vms.member
}

# Job containers (container: image:) from the Artifact Registry repositories listed: read-only.
resource "google_artifact_registry_repository_iam_member" "vms_containers" {
  for_each   = toset(var.container_repositories)
  project    = var.project
  location   = split("/", each.value)[0]
  repository = split("/", each.value)[1]
  role       = "roles/artifactregistry.reader"
  member     = google_service_account.vms.member
}

resource "google_project_iam_member" "vms_log_writer" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.vms.member
}

# Builder: Cloud Build reads the source zip, writes the function image and its build log; nothing else.
resource "google_storage_bucket_iam_member" "builder_sources" {
  bucket = google_storage_bucket.sources.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.builder.member
}

resource "google_project_iam_member" "builder" {
  for_each = toset(["roles/artifactregistry.writer", "roles/logging.logWriter"])
  project  = var.project
  role     = each.value
  member   = google_service_account.builder.member
}

# GCS publishes bucket events to Eventarc through Pub/Sub.
data "google_storage_project_service_account" "gcs" {}

resource "google_project_iam_member" "gcs_pubsub_publisher" {
  project = var.project
  role    = "roles/pubsub.publisher"
  member  = data.google_storage_project_service_account.gcs.member
}

# Submitters: each member of var.submitters[owner] may create objects only in that owner's queue/<owner>/
# (job drops), code/<owner>/ (code bundles) and cancels/<owner>/ (requests that the functions cancel one of its
# jobs), so the launcher's owner, the drop's folder, is who wrote it. objectCreator cannot overwrite or delete (that
# needs storage.objects.delete): drops, code and cancel requests are create-only.
resource "google_storage_bucket_iam_member" "submitters_write" {
  for_each = local.submitter_grants
  bucket   = google_storage_bucket.registry.name
  role     = "roles/storage.objectCreator"
  member   = each.value.member
  condition {
    title       = "jobplane owner ${each.value.owner}"
    description = "Create objects only under queue/${each.value.owner}/, code/${each.value.owner}/ and cancels/${each.value.owner}/"
    expression  = "resource.name.startsWith('${local.objects}queue/${each.value.owner}/') || resource.name.startsWith('${local.objects}code/${each.value.owner}/') || resource.name.startsWith('${local.objects}cancels/${each.value.owner}/')"
  }
}

# ... and read what `ls`, `describe`, `wait`, `queue` and `cost` read of every team's (records, events, attempts,
# stop requests, drops, rejections, sweeps, admission, markers, heartbeats, the policy), and only their own team's
# jobs' data (teams/<owner>/: logs, metrics, checkpoints, artifacts) and code bundles: never another team's. IAM
# allows a condition 12 logical operators at most: these 12 terms use 11. The data of a job recorded before teams/
# existed stays under jobs/<id>/, where every member reads it (docs/operations.md, Owners).
# jobplane.local.gcp_grants mirrors both conditions for the local cloud (tests/gcp/test_terraform.py holds them equal).
resource "google_storage_bucket_iam_member" "submitters_read" {
  for_each = local.submitter_grants
  bucket   = google_storage_bucket.registry.name
  role     = "roles/storage.objectViewer"
  member   = each.value.member
  condition {
    title       = "jobplane owner ${each.value.owner} reads"
    description = "Read the registry's records and only teams/${each.value.owner}/ and code/${each.value.owner}/ of the teams' data"
    expression  = "resource.name.startsWith('${local.objects}jobs/') || resource.name.startsWith('${local.objects}queue/') || resource.name.startsWith('${local.objects}rejected/') || resource.name.startsWith('${local.objects}sweeps/') || resource.name.startsWith('${local.objects}admission/') || resource.name.startsWith('${local.objects}active/') || resource.name.startsWith('${local.objects}active-sweeps/') || resource.name.startsWith('${local.objects}heartbeats/') || resource.name.startsWith('${local.objects}preempted-jobs/') || resource.name.startsWith('${local.objects}teams/${each.value.owner}/') || resource.name.startsWith('${local.objects}code/${each.value.owner}/') || resource.name == '${local.objects}config/policy.yaml'"
  }
}

# ... and list the registry, names only. GCS checks a listing on the bucket's name, never the objects', so no
# condition on object names can scope it: a role holding storage.objects.list alone, without a condition. What a
# listing shows is names only: every key's, another team's data and code bundles too, never what they hold.
resource "google_project_iam_custom_role" "submitters_list" {
  role_id     = "jobplaneSubmittersList"
  title       = "jobplane submitters: list the registry"
  description = "List object names in the registry bucket. Nothing that reads or writes an object."
  permissions = ["storage.objects.list"]
}

resource "google_storage_bucket_iam_member" "submitters_list" {
  for_each = toset(distinct(flatten(values(var.submitters))))
  bucket   = google_storage_bucket.registry.name
  role     = google_project_iam_custom_role.submitters_list.name
  member   = each.value
}

# ---- secrets (jobplane secret set|ls|rm; docs/operations.md#secrets) -------------------------------------------
data "google_project" "this" {
  project_id = var.project
}

# The vend function reads a job's secrets for it (a downscoped token reaches Cloud Storage only): this deployment's.
resource "google_project_iam_member" "functions_secrets" {
  project = var.project
  role    = "roles/secretmanager.secretAccessor"
  member  = google_service_account.functions.member
  condition {
    title       = "jobplane secrets"
    description = "Read only this deployment's secrets"
    expression  = "resource.name.startsWith('${local.secrets_prefix}')"
  }
}

# A member sets, rotates and deletes its own team's secrets, never reads a value (no versions.access).
resource "google_project_iam_custom_role" "submitters_secrets" {
  role_id     = "jobplaneSubmittersSecrets"
  title       = "jobplane submitters: their team's secrets"
  description = "Create, rotate and delete secrets; never read a value."
  permissions = ["secretmanager.secrets.create", "secretmanager.secrets.get", "secretmanager.secrets.update",
    "secretmanager.secrets.delete", "secretmanager.versions.add", "secretmanager.versions.list",
  "secretmanager.versions.destroy"]
}

resource "google_project_iam_member" "submitters_secrets" {
  for_each = local.submitter_grants
  project  = var.project
  role     = google_project_iam_custom_role.submitters_secrets.name
  member   = each.value.member
  condition {
    title       = "jobplane secrets of ${each.value.owner}"
    description = "Only the secrets of owner ${each.value.owner}"
    expression  = "resource.name.startsWith('${local.secrets_prefix}${each.value.owner}_S_')"
  }
}

# `secret ls`: a listing cannot be held to a name (as the bucket's): names and labels of every secret, no value.
resource "google_project_iam_custom_role" "submitters_secrets_list" {
  role_id     = "jobplaneSubmittersSecretsList"
  title       = "jobplane submitters: list secrets"
  description = "List secrets' names and labels. Nothing that reads a value."
  permissions = ["secretmanager.secrets.list"]
}

resource "google_project_iam_member" "submitters_secrets_list" {
  for_each = toset(distinct(flatten(values(var.submitters))))
  project  = var.project
  role     = google_project_iam_custom_role.submitters_secrets_list.name
  member   = each.value
}

# ---- job notifications --------------------------------------------------------------------------------
# The functions publish when a job ends or is flagged for idle GPUs (jobplane.deployment.notify); only they may.
resource "google_pubsub_topic" "notifications" {
  name       = "jobplane-jobs"
  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic_iam_member" "functions_publish" {
  topic  = google_pubsub_topic.notifications.id
  role   = "roles/pubsub.publisher"
  member = google_service_account.functions.member
}

# A pull subscription to read them from (gcloud pubsub subscriptions pull jobplane-jobs), if wanted.
resource "google_pubsub_subscription" "notifications" {
  count                      = var.notification_subscription ? 1 : 0
  name                       = "jobplane-jobs"
  topic                      = google_pubsub_topic.notifications.id
  message_retention_duration = "604800s"
  expiration_policy {
    ttl = ""
  }
}

# ---- network for the job VMs --------------------------------------------------------------------------
resource "google_compute_network" "jobs" {
  name                    = "jobplane"
  auto_create_subnetworks = false
  depends_on              = [google_project_service.apis]
}

# Private Google Access: the VMs, which have no external IP, reach Google's APIs and the vend function (an internal
# caller for its ingress setting) without the NAT. Flow logs of every connection, as the AWS VPC's, aggregated
# over 5 minutes: Cloud Logging bills what they write, and a training job's connections are few and long.
resource "google_compute_subnetwork" "jobs" {
  name                     = "jobplane-${var.region}"
  region                   = var.region
  network                  = google_compute_network.jobs.id
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_5_MIN"
    flow_sampling        = 1.0
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "jobs" {
  name    = "jobplane-${var.region}"
  region  = var.region
  network = google_compute_network.jobs.id
}

resource "google_compute_router_nat" "jobs" {
  name                               = "jobplane-${var.region}"
  router                             = google_compute_router.jobs.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
}

# Multi-node jobs talk to each other (NCCL, the master port); nothing else gets in.
resource "google_compute_firewall" "jobs_internal" {
  name                    = "jobplane-internal"
  network                 = google_compute_network.jobs.id
  direction               = "INGRESS"
  source_service_accounts = [google_service_account.vms.email]
  target_service_accounts = [google_service_account.vms.email]
  allow {
    protocol = "all"
  }
}

# `jobplane ssh` through IAP only, when asked for: no other source reaches a job VM from outside.
resource "google_compute_firewall" "iap_ssh" {
  count                   = var.ssh_via_iap ? 1 : 0
  name                    = "jobplane-iap-ssh"
  network                 = google_compute_network.jobs.id
  direction               = "INGRESS"
  source_ranges           = ["35.235.240.0/20"]
  target_service_accounts = [google_service_account.vms.email]
  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# ---- functions ----------------------------------------------------------------------------------------
# Every function's ingress is ALLOW_INTERNAL_ONLY: its callers are all inside the project. Cloud Run counts Eventarc
# (the launcher's trigger) and Cloud Scheduler (the HTTP functions) of the same project as internal sources, and
# requests from the project's VPC networks (the job VMs calling vend, through Private Google Access). Nothing on the
# internet reaches a function, whatever IAM would say.
resource "google_cloudfunctions2_function" "launcher" {
  name     = "jobplane-launcher"
  location = var.region

  build_config {
    runtime         = "python312"
    entry_point     = "launcher"
    service_account = google_service_account.builder.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.function_source.name
      }
    }
  }

  service_config {
    available_memory      = "512M"
    timeout_seconds       = 540
    max_instance_count    = 10
    ingress_settings      = "ALLOW_INTERNAL_ONLY"
    service_account_email = google_service_account.functions.email
    environment_variables = local.env
  }

  event_trigger {
    trigger_region        = var.region
    event_type            = "google.cloud.storage.object.v1.finalized"
    retry_policy          = "RETRY_POLICY_DO_NOT_RETRY" # the backstop picks up whatever an event missed
    service_account_email = google_service_account.functions.email
    event_filters {
      attribute = "bucket"
      value     = google_storage_bucket.registry.name
    }
  }

  depends_on = [google_project_service.apis, google_project_iam_member.gcs_pubsub_publisher,
  google_project_iam_member.functions_event_receiver, google_project_iam_member.builder]
}

resource "google_cloudfunctions2_function" "http" {
  for_each = local.http_functions
  name     = "jobplane-${replace(each.key, "_", "-")}"
  location = var.region

  build_config {
    runtime         = "python312"
    entry_point     = each.key
    service_account = google_service_account.builder.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.function_source.name
      }
    }
  }

  service_config {
    available_memory      = each.value[0]
    timeout_seconds       = each.value[1]
    max_instance_count    = 1 # one reconciler run at a time; CAS keeps overlapping runs safe anyway
    ingress_settings      = "ALLOW_INTERNAL_ONLY"
    service_account_email = google_service_account.functions.email
    environment_variables = local.env
  }

  depends_on = [google_project_service.apis, google_project_iam_member.builder]
}

# Credential vending: a job VM posts its identity token and gets its job's storage credentials, a token of
# the functions' account downscoped to that job's keys (Credential Access Boundary, exchanged at STS). It
# looks the VM up (compute.instances.get, in functions_compute) and reads the job record.
resource "google_cloudfunctions2_function" "vend" {
  name     = "jobplane-vend"
  location = var.region

  build_config {
    runtime         = "python312"
    entry_point     = "vend"
    service_account = google_service_account.builder.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.function_source.name
      }
    }
  }

  service_config {
    available_memory      = "512M"
    timeout_seconds       = 60
    max_instance_count    = 20 # a refresh per VM per hour, and a burst when a big job boots
    ingress_settings      = "ALLOW_INTERNAL_ONLY"
    service_account_email = google_service_account.functions.email
    environment_variables = merge(local.env, { JOBPLANE_VM_SERVICE_ACCOUNT = google_service_account.vms.email })
  }

  depends_on = [google_project_service.apis, google_project_iam_member.builder]
}

# Only the job VMs may call it (and it still checks which VM, of which job, is asking).
resource "google_cloud_run_service_iam_member" "vms_vend_invoker" {
  location = var.region
  service  = google_cloudfunctions2_function.vend.service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.vms.member
}

# The launcher's Eventarc trigger and the scheduler call the functions' Cloud Run services; nobody else may.
resource "google_cloud_run_service_iam_member" "launcher_trigger_invoker" {
  location = var.region
  service  = google_cloudfunctions2_function.launcher.service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.functions.member
}

resource "google_cloud_run_service_iam_member" "scheduler_invoker" {
  for_each = local.http_functions
  location = var.region
  service  = google_cloudfunctions2_function.http[each.key].service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

# ---- schedules ----------------------------------------------------------------------------------------
resource "google_cloud_scheduler_job" "http" {
  for_each         = local.http_functions
  name             = "jobplane-${replace(each.key, "_", "-")}"
  region           = var.region
  schedule         = var.schedules[each.key]
  time_zone        = "Etc/UTC"
  attempt_deadline = "${each.value[1]}s"

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.http[each.key].service_config[0].uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.http[each.key].service_config[0].uri
    }
  }

  retry_config {
    retry_count = 0 # the next tick is the retry
  }

  depends_on = [google_project_service.apis]
}
