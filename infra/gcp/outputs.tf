output "bucket" {
  description = "Registry bucket."
  value       = google_storage_bucket.registry.name
}

output "registry" {
  description = "The registry for the CLI: export JOBPLANE_BUCKET=<registry> (or jobplane ... --bucket <registry>)"
  value       = trimsuffix("gs://${google_storage_bucket.registry.name}/${local.prefix}", "/")
}

output "queue_uri" {
  description = "Drop job specs in its owner folders: gcloud storage cp job.yaml <queue_uri><owner>/ (a spec without owner: <queue_uri>)"
  value       = "gs://${google_storage_bucket.registry.name}/${local.prefix}queue/"
}

output "function_uris" {
  description = "HTTP functions (OIDC-authenticated; invoked by Cloud Scheduler, internal ingress only: run one now with gcloud scheduler jobs run jobplane-<name>)."
  value       = { for k, f in google_cloudfunctions2_function.http : k => f.service_config[0].uri }
}

output "vend_url" {
  description = "The credential vending function job VMs call (JOBPLANE_VEND_URL)."
  value       = local.vend_url
}

output "functions_service_account" {
  value = google_service_account.functions.email
}

output "vm_service_account" {
  value = google_service_account.vms.email
}

output "scheduler_service_account" {
  value = google_service_account.scheduler.email
}

output "subnetwork" {
  value = google_compute_subnetwork.jobs.id
}

output "notification_topic" {
  description = "Job notifications (a job ended, idle GPUs): subscribe to it."
  value       = google_pubsub_topic.notifications.id
}
