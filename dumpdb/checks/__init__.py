"""Checks over one run: first NaN/Inf, fp16 overflow, all-zero, MindInsight watch conditions."""
