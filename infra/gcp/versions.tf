terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.40, < 8.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}
