"""The public face of each op family: its plans and functional forms, over its contract."""
