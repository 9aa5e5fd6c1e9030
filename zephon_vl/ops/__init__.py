"""Vision-language operators: decode documents, tokenize with vision tokens, collate to tensors."""
