variable "project" {
  description = "GCP project id to deploy into."
  type        = string
}

variable "region" {
  description = "Region for the functions, the scheduler jobs, the VM subnet and regional launches."
  type        = string
  default     = "us-central1"
}

variable "bucket_name" {
  description = "Registry bucket (the only state). Defaults to <project>-jobplane."
  type        = string
  default     = ""
}

variable "registry_root" {
  description = "Optional prefix inside the bucket for the registry (queue/ lives under it)."
  type        = string
  default     = ""
}

variable "source_zip" {
  description = "Function source built by `make gcp-package`."
  type        = string
  default     = "../../build/gcp-functions.zip"
}

variable "agent_dir" {
  description = "The agent bundles and manifest.json for the VMs, built by `make gcp-package`."
  type        = string
  default     = "../../build/agent"
}

variable "default_image" {
  description = "Image for jobs whose spec names none, on CPU machine types: an alias (ubuntu-24.04, debian-12) or a GCE image path."
  type        = string
  default     = "ubuntu-24.04"
}

variable "default_gpu_image" {
  description = "Image for jobs whose spec names none, on GPU machine types (a2, a3, a4, g2, g4): an alias or a GCE image path."
  type        = string
  default     = "ubuntu-24.04-gpu"
}

variable "subnet_cidr" {
  description = "Range of the subnet the job VMs run in (no external IPs: Cloud NAT and Private Google Access)."
  type        = string
  default     = "10.64.0.0/20"
}

variable "policy" {
  description = "Extra config/policy.yaml fields (caps, quotas, safety); the gcp placement is filled in."
  type        = any
  default     = {}
}

variable "schedules" {
  description = "Cron schedules (Cloud Scheduler, UTC) of the HTTP functions."
  type        = map(string)
  default = {
    launcher_backstop = "* * * * *"
    sweeper           = "*/5 * * * *"
    rerun             = "*/2 * * * *"
    uptime_cap        = "*/5 * * * *"
  }
}

variable "noncurrent_version_days" {
  description = "Days a registry object's overwritten versions are kept (versioning is on for recovery)."
  type        = number
  default     = 7
}

variable "data_buckets" {
  description = "Buckets (names, not gs:// URIs) the job VMs may read: inputs: channels and code: tarballs outside the registry."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for b in var.data_buckets : can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", b))])
    error_message = "data_buckets holds bucket names such as my-datasets, not gs:// URIs or paths."
  }
}

variable "container_repositories" {
  description = "Artifact Registry repositories (LOCATION/REPOSITORY, in var.project) the job VMs may pull job containers from (container: image:), read-only."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for r in var.container_repositories : can(regex("^[a-z0-9-]+/[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", r))])
    error_message = "container_repositories holds LOCATION/REPOSITORY names such as us-central1/training, not image URLs."
  }
}

variable "ssh_via_iap" {
  description = "Let `jobplane ssh` reach job VMs through IAP TCP forwarding: a firewall rule admits IAP's range (35.235.240.0/20) on port 22, to the job VMs only. Who may tunnel is IAM's (roles/iap.tunnelResourceAccessor); the policy's access.ssh must be on too."
  type        = bool
  default     = false
}

variable "submitters" {
  description = "Who submits jobs as which owner: { owner = [members] }, e.g. { vision = [\"group:vision@example.com\"] }. Members create objects only in queue/<owner>/, code/<owner>/ and cancels/<owner>/, read the registry's records and only their own team's data (teams/<owner>/, code/<owner>/), and list it."
  type        = map(list(string))
  default     = {}
  validation {
    condition     = alltrue([for owner in keys(var.submitters) : can(regex("^[a-z][a-z0-9_-]{0,62}$", owner))])
    error_message = "submitters' keys are owner names: a lowercase letter, then up to 62 of a-z 0-9 _ -."
  }
}

variable "notification_subscription" {
  description = "Create a pull subscription (jobplane-jobs) to the job-notification topic."
  type        = bool
  default     = false
}
