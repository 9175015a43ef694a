variable "db_password" {
  description = "Master password of the orders database; injected by the gateway, never committed."
  type        = string
  sensitive   = true
}

variable "subnet_group" {
  type    = string
  default = "orders-private"
}
