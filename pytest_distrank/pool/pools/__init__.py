"""pool.pools"""
