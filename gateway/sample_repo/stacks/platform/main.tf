variable "private_subnet_ids" {
  description = "From the network stack's outputs."
  type        = list(string)
  default     = ["subnet-0a1b2c3d4e5f60001", "subnet-0a1b2c3d4e5f60002"]
}

locals {
  tags = {
    owner         = "platform-team"
    "cost-centre" = "cc-1001"
    stack         = "platform"
  }
}

resource "aws_iam_role" "eks" {
  name = "orders-eks-cluster"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "eks.amazonaws.com" }
    }]
  })
  tags = local.tags
}

resource "aws_eks_cluster" "main" {
  name     = "orders"
  role_arn = aws_iam_role.eks.arn
  version  = "1.30"

  vpc_config {
    subnet_ids              = var.private_subnet_ids
    endpoint_public_access  = false
    endpoint_private_access = true
  }

  tags = local.tags
}
