"""operator/rtj"""
