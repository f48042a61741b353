"""pool.onetest"""
