"""trainer-image/rtj_trainer"""
