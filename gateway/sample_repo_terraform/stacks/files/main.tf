# Objects of the test provider (example.local/gateway/sim): JSON files the provider keeps in
# $SIM_PROVIDER_DIR, so drift is a file edited behind Terraform's back. Real Terraform, no cloud.
terraform {
  required_providers {
    sim = {
      source  = "example.local/gateway/sim"
      version = "0.1.0"
    }
  }
}

variable "api_key" {
  description = "Supplied by the gateway from its secrets; never committed."
  type        = string
  sensitive   = true
}

resource "sim_object" "config" {
  name    = "app-config"
  content = "replicas=2"
}

resource "sim_object" "credentials" {
  name   = "app-credentials"
  secret = var.api_key
}

output "config_id" {
  value = sim_object.config.id
}
