variable "vpc_id" {
  description = "From the network stack's outputs."
  type        = string
  default     = "vpc-0f1e2d3c4b5a69788"
}

variable "subnet_ids" {
  type    = list(string)
  default = ["subnet-0a1b2c3d4e5f60011", "subnet-0a1b2c3d4e5f60012"]
}

variable "web_count" {
  type    = number
  default = 1
}

locals {
  env = "staging"
  tags = {
    owner         = "app-team"
    "cost-centre" = "cc-3003"
    stack         = "app-${local.env}"
  }
}

resource "aws_security_group" "web" {
  name        = "orders-web-${local.env}"
  description = "HTTPS to the orders web tier"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group_rule" "https" {
  type              = "ingress"
  from_port         = 443
  to_port           = 443
  protocol          = "tcp"
  cidr_blocks       = ["0.0.0.0/0"]
  security_group_id = aws_security_group.web.id
}

resource "aws_instance" "web" {
  count                  = var.web_count
  ami                    = "ami-0c1c30571d2dae5c9"
  instance_type          = "t3.small"
  subnet_id              = var.subnet_ids[count.index % length(var.subnet_ids)]
  vpc_security_group_ids = [aws_security_group.web.id]

  tags = merge(local.tags, { Name = "orders-web-${local.env}-${count.index}" })
}

resource "aws_lb" "web" {
  name               = "orders-web-${local.env}"
  load_balancer_type = "application"
  subnets            = var.subnet_ids
  security_groups    = [aws_security_group.web.id]
  tags               = local.tags
}

resource "aws_route53_record" "web" {
  zone_id = "Z0123456789ABCDEFGHIJ"
  name    = "staging.orders.example.com"
  type    = "CNAME"
  ttl     = 300
  records = [aws_lb.web.dns_name]
}
