terraform {
  required_providers {
    null = {
      source  = "hashicorp/null"
      version = "2.1.2"
    }
  }
}

resource "null_resource" "marker" {
  triggers = {
    release = "1"
  }
}
