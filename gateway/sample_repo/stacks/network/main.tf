locals {
  tags = {
    owner         = "platform-team"
    "cost-centre" = "cc-1001"
    stack         = "network"
  }
  azs = ["eu-west-1a", "eu-west-1b"]
}

resource "aws_vpc" "main" {
  cidr_block           = "10.20.0.0/16"
  enable_dns_hostnames = true

  tags = merge(local.tags, { Name = "orders-vpc" })

  lifecycle {
    prevent_destroy = true
  }
}

resource "aws_subnet" "private" {
  count             = length(local.azs)
  vpc_id            = aws_vpc.main.id
  cidr_block        = cidrsubnet(aws_vpc.main.cidr_block, 4, count.index)
  availability_zone = local.azs[count.index]

  tags = merge(local.tags, { Name = "private-${local.azs[count.index]}", tier = "private" })
}

resource "aws_subnet" "public" {
  count                   = length(local.azs)
  vpc_id                  = aws_vpc.main.id
  cidr_block              = cidrsubnet(aws_vpc.main.cidr_block, 4, count.index + 8)
  availability_zone       = local.azs[count.index]
  map_public_ip_on_launch = true

  tags = merge(local.tags, { Name = "public-${local.azs[count.index]}", tier = "public" })
}

resource "aws_security_group" "internal" {
  name        = "orders-internal"
  description = "Traffic between the orders services"
  vpc_id      = aws_vpc.main.id

  tags = local.tags
}

resource "aws_security_group_rule" "internal_ingress" {
  type              = "ingress"
  from_port         = 0
  to_port           = 65535
  protocol          = "tcp"
  cidr_blocks       = [aws_vpc.main.cidr_block]
  security_group_id = aws_security_group.internal.id
}
