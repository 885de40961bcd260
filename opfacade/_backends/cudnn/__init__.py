"""cuDNN v9 fused attention graphs through nvidia-cudnn-frontend (cudnn.pygraph)."""
