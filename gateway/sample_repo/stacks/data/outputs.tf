output "db_endpoint" {
  value = aws_db_instance.orders.endpoint
}

output "db_password" {
  value     = aws_db_instance.orders.password
  sensitive = true
}
